"""scripts/sass_path.py on a small hand-written SASS listing: straight-line counts, branches taken
or not by decision, loops, predicated instructions, and the errors for bad input."""
import contextlib
import importlib.util
import io
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location(
    "sass_path", os.path.join(HERE, "..", "..", "scripts", "sass_path.py"))
sp = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sp)

# The shape of cuobjdump's listing: an address comment, the instruction, its encoding comment,
# and a second line holding the rest of the encoding.
LISTING = """
        Function : _Z6kernelv
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000fe40000000f00 */
        /*0010*/                   ISETP.NE.AND P0, PT, R1, RZ, PT ;      /* 0x000000ff0100720c */
                                                                          /* 0x000fda0003f05270 */
        /*0020*/              @!P0 BRA 0x60 ;                             /* 0x0000000000008947 */
                                                                          /* 0x000fea0003800000 */
        /*0030*/                   FFMA R2, R3, R4, R2 ;                  /* 0x0000000403027223 */
                                                                          /* 0x000fe20000000002 */
        /*0040*/               @P0 FMUL R2, R2, R2 ;                      /* 0x0000000202020220 */
                                                                          /* 0x000fe20000400000 */
        /*0050*/               @P1 BRA 0x30 ;                             /* 0x0000000000008947 */
                                                                          /* 0x000fea0003800000 */
        /*0060*/                   IADD3 R5, R5, 0x1, RZ ;                /* 0x0000000105057810 */
                                                                          /* 0x000fe20007ffe0ff */
        /*0070*/                   BRA 0x90 ;                             /* 0x0000000000047947 */
                                                                          /* 0x000fea0003800000 */
        /*0080*/                   NOP ;                                  /* 0x0000000000007918 */
                                                                          /* 0x000fc00000000000 */
        /*0090*/                   EXIT ;                                 /* 0x000000000000794d */
                                                                          /* 0x000fea0003800000 */
"""


class SassPath(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.path = os.path.join(self.dir.name, "k.sass")
        with open(self.path, "w") as f:
            f.write(LISTING)
        self.code = sp.read_sass(self.path)

    def count(self, decisions):
        ops = sp.walk(self.code, 0x0, 0x90, decisions)
        return sum(ops.values()), ops

    def test_reads_every_instruction_once(self):
        self.assertEqual(sorted(self.code), list(range(0, 0xa0, 0x10)))
        self.assertEqual(self.code[0x20], "@!P0 BRA 0x60")
        self.assertEqual(sp.opcode(self.code[0x40]), "FMUL")

    def test_falls_through_and_follows_unconditional_branches(self):
        # 0x00-0x50 (the loop's back edge not taken), 0x60, then BRA over the NOP to the end
        n, ops = self.count({})
        self.assertEqual(n, 8)
        self.assertEqual(ops["NOP"], 0)
        self.assertEqual(ops["FMUL"], 1)  # predicated, still issued

    def test_taken_branch_skips_its_body(self):
        n, ops = self.count({0x20: "T"})
        self.assertEqual(n, 5)  # MOV ISETP BRA IADD3 BRA
        self.assertEqual(ops["FFMA"], 0)

    def test_loop_back_edge_taken_k_times(self):
        for k in range(4):
            n, ops = self.count({0x50: f"L{k}"})
            self.assertEqual(ops["FFMA"], k + 1)
            self.assertEqual(n, 8 + 3 * k)

    def test_command_line(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = sp.main([self.path, "0", "90", "50=L2", "20=N"])
        self.assertEqual(rc, 0)
        self.assertTrue(out.getvalue().startswith("14 instructions: "), out.getvalue())

    def test_bad_input(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
            sp.main([self.path, "0", "90", "50=X"])
        with self.assertRaisesRegex(SystemExit, "no instruction at 0x8"):
            sp.walk(self.code, 0x8, 0x90, {})
        with self.assertRaisesRegex(SystemExit, "no end reached"):
            sp.walk(self.code, 0x0, 0x90, {0x50: "T"}, limit=100)


if __name__ == "__main__":
    unittest.main()
