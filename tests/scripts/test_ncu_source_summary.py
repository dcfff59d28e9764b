"""scripts/ncu_source_summary.py on a small hand-written source page: regions (straight-line
code, a loop, a branch body inside straight-line code), the stall reasons' shares, the ranking of
instructions, the choice of kernel, a launch listed twice, and the errors for pages without the
needed columns."""
import unittest

from script_test_util import ScriptTestCase, load_script

ns = load_script("ncu_source_summary")

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)",'
          '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_long_sb",'
          '"stall_barrier","stall_long_sb (Not Issued)"\n')
# Kernel 1: 4 warps. Instructions 0-1 straight, 2 a branch body taken by 2 warps, 3-5 a loop
# (8 and 16 times per warp), 6 straight again. Kernel 2: one instruction.
PAGE = ('"Kernel Name","void k1(int)"\n' + HEADER +
        '"0x10","  LDG.E R2, [R4]","1","1","4","1","0","1"\n'
        '"0x20","  STG.E [R6], R2","30","30","4","30","0","30"\n'
        '"0x30","@P0 IADD3 R1, R1, 1","0","0","2","0","0","0"\n'
        '"0x40","  LDG.E R8, [R4]","2","1","32","2","0","2"\n'
        '"0x50","@P1 BRA 0x40","50","49","32","50","0","50"\n'
        '"0x60","  FFMA R9, R9, R9, R9","1,200","0","64","0","0","0"\n'
        '"0x70","  BAR.SYNC 0x0","17","17","4","0","17","0"\n'
        '"Kernel Name","void k2()"\n' + HEADER +
        '"0x10","  EXIT","5","5","1","0","5","0"\n')


class NcuSourceSummary(ScriptTestCase):
    script = ns

    def page(self, text=PAGE):
        return self.write("source.csv", text)

    def test_reads_both_kernels_and_their_numbers(self):
        kernels = ns.read_kernels(self.page())
        self.assertEqual([k[0] for k in kernels], ["void k1(int)", "void k2()"])
        code = kernels[0][1]
        self.assertEqual(len(code), 7)
        self.assertEqual(code[5]["samples"], 1200)  # a thousands separator
        self.assertEqual(code[4]["stalls"], {"long_sb": 50, "barrier": 0})  # not-issued left out

    def test_a_launch_listed_twice_is_read_once(self):
        first = PAGE.split('"Kernel Name","void k2()"')[0]
        kernels = ns.read_kernels(self.page(first + first + PAGE))
        self.assertEqual([k[0] for k in kernels], ["void k1(int)", "void k2()"])

    def test_regions_keep_a_branch_body_in_its_straight_line_code(self):
        code = ns.read_kernels(self.page())[0][1]
        self.assertEqual(ns.regions(code), [(0, 2, False), (3, 5, True), (6, 6, False)])

    def test_report_splits_samples_by_region_reason_and_instruction(self):
        _, out, _ = self.run_main(self.page(), "--top", "2")
        total = 1 + 30 + 2 + 50 + 1200 + 17
        self.assertIn(f"warp-state samples: {total}", out)
        self.assertIn(f"{100 * 1252 / total:5.1f}%  loop   3-5 (0x40..0x60), executed up to 64 times",
                      out)
        self.assertIn(f"{100 * 31 / total:5.1f}%  linear 0-2", out)
        self.assertIn(f"long_sb {100 * 83 / total:.1f}%", out)
        lines = out.splitlines()
        top = lines[lines.index("top 2 instructions by samples:") + 1:]
        self.assertEqual(len(top), 2)
        self.assertIn("[5] FFMA", top[0])
        self.assertIn("[4] @P1 BRA 0x40", top[1])
        self.assertIn("mostly long_sb", top[1])

    def test_counts_instructions_per_warp_by_region_and_opcode(self):
        _, out, _ = self.run_main(self.page(), "--opcodes", "3")
        # 4 warps (the first instruction's count); 142 instructions executed in all.
        self.assertIn("instructions executed: 142 (35.5 per warp of 4)", out)
        self.assertIn("executed up to 64 times, 32.0 instructions per warp", out)  # 32 + 32 + 64
        self.assertIn("executed up to 4 times, 2.5 instructions per warp", out)  # 4 + 4 + 2
        # FFMA 64, LDG 4 + 32 (the two loads), BRA 32 (predicated, so its predicate is dropped).
        self.assertIn("by opcode (instructions per warp): FFMA 16.0, LDG 9.0, BRA 8.0\n", out)
        self.assertEqual(ns.opcode("@!P0 IMAD.WIDE.U32 R2, R3, 0x4, RZ"), "IMAD")
        self.assertEqual(ns.opcode("  EXIT"), "EXIT")

    def test_picks_another_kernel(self):
        _, out, _ = self.run_main(self.page(), "--kernel", "2")
        self.assertIn("kernel: void k2()", out)
        self.assertIn("warp-state samples: 5", out)
        self.assertIn("mostly barrier", out)

    def test_errors_name_the_problem(self):
        with self.assertRaises(SystemExit) as e:
            ns.main([self.page(), "--kernel", "3"])
        self.assertIn("the page has 2", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            ns.read_kernels(self.page('"Kernel Name","k"\n"Address","Source"\n'))
        self.assertIn("lacks the column", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            ns.read_kernels(self.page("nothing here\n"))
        self.assertIn("no kernel", str(e.exception))


if __name__ == "__main__":
    unittest.main()
