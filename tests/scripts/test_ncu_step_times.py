"""scripts/ncu_step_times.py on a small ncu CSV: steps split at validate, grouped by verify."""
import importlib.util
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location(
    "ncu_step_times", os.path.join(HERE, "..", "..", "scripts", "ncu_step_times.py"))
nst = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(nst)

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def row(i, name, ns, metric="gpu__time_duration.sum", unit="ns"):
    return (f'"{i}","1","replayssm","h","{name}","1","16","(128, 1, 1)","(1, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{ns}"')


class StepTimes(unittest.TestCase):
    def test_steps_grouped_by_verify(self):
        names = [
            ("void flush_kernel<6, unsigned short, 0, 1, 0>(ReplayParams)", "9,000"),  # dropped
            ("void validate_tokens_kernel<unsigned short>(ReplayParams)", "4,000"),
            ("void flush_kernel<6, unsigned short, 0, 1, 0>(ReplayParams)", "2,000"),
            ("void verify_kernel<6, unsigned short, 1, 1, 3, 2>(ReplayParams)", "20,000"),
            ("void validate_tokens_kernel<unsigned short>(ReplayParams)", "6,000"),
            ("void flush_kernel<6, unsigned short, 0, 1, 0>(ReplayParams)", "80,000"),
            ("void verify_kernel<6, unsigned short, 8, 1, 3, 2>(ReplayParams)", "50,000"),
            ("void commit_kernel(SlotCursors *, const int *, const int *, int)", "3,000"),
            ("void validate_tokens_kernel<unsigned short>(ReplayParams)", "7,000"),
            ("void flush_kernel<6, unsigned short, 0, 1, 0>(ReplayParams)", "100,000"),
            ("void verify_kernel<6, unsigned short, 8, 1, 3, 2>(ReplayParams)", "60,000"),
        ]
        text = "==PROF== noise\n" + HEADER + "\n" + "\n".join(
            row(i, n, v) for i, (n, v) in enumerate(names)) + "\n"
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(text)
        try:
            st = nst.steps(nst.read_rows(f.name))
        finally:
            os.unlink(f.name)
        self.assertEqual(len(st), 3)
        self.assertEqual([k for k, _, _ in st[1]], ["validate", "flush", "verify", "commit"])
        self.assertAlmostEqual(sum(us for _, _, us in st[1]), 139.0)
        self.assertAlmostEqual(st[2][1][2], 100.0)  # flush of the last step, in us
        self.assertTrue(st[2][2][1].startswith("void verify_kernel<6, unsigned short, 8"))

    def test_other_metric_in_millions(self):
        names = [
            ("void validate_tokens_kernel<unsigned short>(ReplayParams)", "4,000", "1,000,000"),
            ("void flush_kernel<6, unsigned short, 0, 1, 0>(ReplayParams)", "80,000", "52,500,000"),
            ("void verify_kernel<6, unsigned short, 8, 1, 3, 2>(ReplayParams)", "50,000",
             "14,000,000"),
        ]
        lines = [HEADER]
        for i, (n, ns, inst) in enumerate(names):
            lines.append(row(i, n, ns))
            lines.append(row(i, n, inst, "smsp__inst_executed.sum", "inst"))
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("\n".join(lines) + "\n")
        try:
            times = nst.steps(nst.read_rows(f.name))
            inst = nst.steps(nst.read_rows(f.name, "smsp__inst_executed.sum"))
            with self.assertRaises(SystemExit):
                nst.read_rows(f.name, "dram__bytes_read.sum")  # not in the CSV
        finally:
            os.unlink(f.name)
        self.assertAlmostEqual(times[0][1][2], 80.0)  # the flush, us
        self.assertAlmostEqual(inst[0][1][2], 52.5)  # the flush, millions of warp instructions
        self.assertAlmostEqual(sum(v for _, _, v in inst[0]), 67.5)

    def test_kind(self):
        self.assertEqual(nst.kind("void verify_kernel<6, float, 1, 1, 3, 2>(ReplayParams)"),
                         "verify")
        self.assertEqual(nst.kind("commit_kernel(SlotCursors *, int)"), "commit")
        self.assertIsNone(nst.kind("void prefill_kernel<6, unsigned short>(ReplayParams)"))


if __name__ == "__main__":
    unittest.main()
