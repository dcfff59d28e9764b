"""scripts/bench_table.py on small bench outputs: the row order, the cells' speedups over the
standard kernels of the same window, the copy-bandwidth fractions, means over runs, the history
filter, the refusal to pool runs of different settings and the errors for bad input."""
import unittest

from script_test_util import ScriptTestCase, load_script

bt = load_script("bench_table")


def bench(rows, history=16):
    """A bench output: rows of (name, batch, window) -> (us_per_step, fraction of copy)."""
    return {"history": history, "rows": [
        {"name": n, "batch": b, "window": w, "us_per_step": t, "fraction_of_copy_bandwidth": f}
        for (n, b, w), (t, f) in rows.items()]}


class BenchTable(ScriptTestCase):
    script = bt

    def test_rows_cells_and_ratios(self):
        run1 = bench({("replay separate-fp8", 64, 8): (100.0, 0.4),
                      ("standard bf16 state + intermediates", 64, 8): (300.0, 0.9),
                      ("standard fp32 state + intermediates", 64, 8): (700.0, 0.9),
                      ("replay separate-fp8", 64, 1): (40.0, 0.6),
                      ("replay shared-fp8", 64, 1): (30.0, 0.7),
                      ("standard bf16 state", 64, 1): (80.0, 0.95),
                      ("standard fp32 state", 64, 1): (160.0, 0.96),
                      ("replay separate-fp8", 8, 1): (10.0, 0.3)})
        run2 = bench({("replay separate-fp8", 64, 1): (60.0, 0.4),
                      ("standard fp32 state", 64, 1): (160.0, 0.94)})
        rc, out, err = self.run_main(self.write("a.json", run1), self.write("b.json", run2))
        self.assertEqual((rc, err), (0, ""))
        lines = out.splitlines()
        self.assertEqual(lines[0], "| us per layer-step (speedup over standard fp32 / bf16) "
                                   "| batch 8 | batch 64 |")
        labels = [line.split(" | ")[0].lstrip("| ") for line in lines[2:]]
        self.assertEqual(labels, ["standard decode, fp32 state", "standard decode, bf16 state",
                                  "replay shared-fp8, autoregressive",
                                  "replay separate-fp8, autoregressive",
                                  "standard, 8 tokens with intermediate states, fp32",
                                  "standard, 8 tokens with intermediate states, bf16",
                                  "replay separate-fp8, verify 8"])
        # Means over the runs that hold a configuration: separate-fp8 W=1 b64 (40 + 60) / 2.
        self.assertIn("| replay separate-fp8, autoregressive | 10.0 | 50.0 (3.20x / 1.60x) |",
                      lines)
        self.assertIn("| standard decode, fp32 state |  | 160.0 (95%) |", lines)
        # W = 8 against the kernels with intermediate states of the same window.
        self.assertIn("| replay separate-fp8, verify 8 |  | 100.0 (7.00x / 3.00x) |", lines)

    def test_combined_files_history_filter_and_errors(self):
        combined = self.write("c.json", {
            "call1-main-r1": bench({("replay shared-fp8", 64, 4): (20.0, 0.5)}, history=32),
            "call1-main-r2": bench({("replay shared-fp8", 64, 4): (30.0, 0.5)}, history=16)})
        rc, out, _ = self.run_main(f"{combined}:call1-main", "--history", "32")
        self.assertEqual(rc, 0)
        self.assertIn("| replay shared-fp8, verify 4 | 20.0 |", out)
        # Without --history the two runs' histories would be averaged into one cell.
        rc, out, err = self.run_main(f"{combined}:call1-main")
        self.assertEqual((rc, out), (2, ""))
        self.assertIn("differ in history 32 / 16", err)
        rc, _, err = self.run_main(combined, "--history", "64")
        self.assertEqual(rc, 2)
        self.assertIn("no run of history 64", err)
        rc, _, err = self.run_main(f"{combined}:call9")
        self.assertEqual(rc, 2)
        self.assertIn("call9", err)
        rc, _, err = self.run_main(self.write("bad.json", "{"))
        self.assertEqual(rc, 2)
        self.assertIn("not JSON", err)


if __name__ == "__main__":
    unittest.main()
