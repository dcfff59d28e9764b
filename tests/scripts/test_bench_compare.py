"""scripts/bench_compare.py on small bench outputs: means, changes, spreads, the standard kernels'
noise, combined results files and their key filter, a cut-short run's stderr, and the errors for
bad input."""
import json
import unittest

from script_test_util import ScriptTestCase, load_script

bc = load_script("bench_compare")


def bench(times):
    """A bench output with one row per (name, batch, window) -> us_per_step."""
    return {"command": "replayssm bench", "rows": [
        {"name": n, "batch": b, "window": w, "us_per_step": t} for (n, b, w), t in times.items()]}


class BenchCompare(ScriptTestCase):
    script = bc

    def test_means_changes_spreads_and_noise(self):
        std, rep = ("standard fp32 state", 64, 1), ("replay separate-fp8", 64, 1)
        a1 = self.write("a1.json", bench({std: 100.0, rep: 50.0}))
        a2 = self.write("a2.json", bench({std: 100.0, rep: 54.0}))
        b1 = self.write("b1.json", bench({std: 102.0, rep: 39.0}))
        b2 = self.write("b2.json", bench({std: 102.0, rep: 39.0, ("replay fp32", 8, 1): 9.0}))
        sets = [bc.parse_set(f"main={a1},{a2}"), bc.parse_set(f"new={b1},{b2}")]
        rows, noise = bc.compare(sets)
        by_name = {r[0]: r for r in rows}
        cells, changes = by_name["replay separate-fp8"][3], by_name["replay separate-fp8"][4]
        self.assertAlmostEqual(cells[0][0], 52.0)
        self.assertEqual(cells[0][1], 2)
        self.assertAlmostEqual(cells[0][2], 100.0 * 4.0 / 52.0)
        self.assertAlmostEqual(changes[0], 100.0 * (39.0 - 52.0) / 52.0)
        # Only the standard rows count as noise (the replay row moved 25%).
        self.assertAlmostEqual(noise, 2.0)
        # A configuration of one set only: no value and no change for the other.
        self.assertIsNone(by_name["replay fp32"][3][0])
        self.assertIsNone(by_name["replay fp32"][4][0])
        rc, out, _ = self.run_main(f"main={a1},{a2}", f"new={b1},{b2}")
        self.assertEqual(rc, 0)
        self.assertIn("| replay separate-fp8 | 64 | 1 | 52.0 (2 runs, 7.7%) | 39.0 (2 runs, 0.0%) "
                      "| -25.0% |", out)
        self.assertIn("| replay fp32 | 8 | 1 | - | 9.0 | - |", out)
        self.assertIn("differ by up to 2.0%", out)

    def test_combined_results_file_and_key_filter(self):
        rep = ("replay shared-fp8", 256, 8)
        path = self.write("call.json", {"r1-off-h8b": bench({rep: 10.0}),
                                        "r2-off-h8b": bench({rep: 12.0}),
                                        "r1-on-h8b": bench({rep: 22.0}), "note": "not a run"})
        rows, _ = bc.compare([bc.parse_set(f"off={path}:-off-"), bc.parse_set(f"on={path}:-on-")])
        cells, changes = rows[0][3], rows[0][4]
        self.assertAlmostEqual(cells[0][0], 11.0)
        self.assertEqual(cells[1][1], 1)
        self.assertAlmostEqual(changes[0], 100.0)
        # Without a filter every run of the file is in the set.
        self.assertEqual(bc.compare([bc.parse_set(f"all={path}")])[0][0][3][0][1], 3)

    def test_a_cut_short_runs_stderr(self):
        # What `replayssm bench` prints while it runs; the device line and other text are no rows.
        err = self.write("r1-main.err", "\n".join([
            "[bench] NVIDIA H100 80GB HBM3, 132 SMs, peak clocks 1980 MHz SM / 2619 MHz memory, "
            "copy bandwidth 2954 GB/s (read + write)",
            "[bench] standard fp32 state + intermediates, batch 64, W 4: 485.4 us/step, 1351.7 "
            "MB/step, 2785 GB/s, 94.3% of copy bandwidth",
            "[bench] replay separate-fp8, batch 64, W 4: 83.4 us/step, 149.9 MB/step, 1797 GB/s, "
            "60.8% of copy bandwidth",
            "warning: something else"]) + "\n")
        full = self.write("r2-main.json", bench({("replay separate-fp8", 64, 4): 84.4,
                                                 ("replay separate-fp8", 256, 4): 290.0}))
        rows, _ = bc.compare([bc.parse_set(f"main={err},{full}")])
        by_key = {r[:3]: r[3][0] for r in rows}
        self.assertEqual(set(by_key), {("standard fp32 state + intermediates", 64, 4),
                                       ("replay separate-fp8", 64, 4),
                                       ("replay separate-fp8", 256, 4)})
        self.assertAlmostEqual(by_key[("replay separate-fp8", 64, 4)][0], 83.9)
        self.assertEqual(by_key[("replay separate-fp8", 64, 4)][1], 2)
        self.assertEqual(by_key[("replay separate-fp8", 256, 4)][1], 1)  # the cut run lacks it
        empty = self.write("cut.err", "[bench] NVIDIA H100, copy bandwidth 2954 GB/s\n")
        for args, message in (([f"a={empty}"], "no '[bench] NAME, batch B, W W: T us/step' line"),
                              ([f"a={err}:r1"], "a run's stderr has no run keys"),
                              ([f"a={self.dir.name}/gone.err"], "cannot read it")):
            with self.subTest(args=args):
                rc, out, stderr = self.run_main(*args)
                self.assertEqual(rc, 2)
                self.assertIn(message, stderr)

    def test_runs_of_other_settings_are_not_pooled(self):
        rep = ("replay separate-fp8", 64, 8)
        h16 = dict(bench({rep: 109.0}), history=16, shape=[128, 64, 128, 8])
        h32 = dict(bench({rep: 112.8}), history=32, shape=[128, 64, 128, 8])
        nano = dict(bench({rep: 90.0}), history=16, shape=[96, 80, 128, 8])
        cut = self.write("cut.err", "[bench] replay separate-fp8, batch 64, W 8: 110.0 us/step\n")
        # Runs of one setting pool, and a cut-short run's stderr (no settings) pools with them.
        path = self.write("same.json", {"r1": h16, "r2": dict(h16)})
        rows, _ = bc.compare([bc.parse_set(f"a={path},{cut}")])
        self.assertEqual(rows[0][3][0][1], 3)
        # Sets may differ from each other: that is what an A/B of a setting compares.
        rows, _ = bc.compare([bc.parse_set(f"h16={self.write('a.json', h16)}"),
                              bc.parse_set(f"h32={self.write('b.json', h32)}")])
        self.assertAlmostEqual(rows[0][4][0], 100.0 * (112.8 - 109.0) / 109.0)
        # A cut-short run's settings line counts like a document's fields.
        settings = json.dumps({"backend": "cuda", "history": 32, "shape": [128, 64, 128, 8]})
        cut32 = self.write("cut32.err", f"[bench] settings {settings}\n"
                           "[bench] replay separate-fp8, batch 64, W 8: 112.0 us/step\n")
        self.assertEqual(bc.stderr_rows(cut32)["history"], 32)
        rows, _ = bc.compare([bc.parse_set(f"a={self.write('h32.json', h32)},{cut32}")])
        self.assertEqual(rows[0][3][0][1], 2)
        rc, out, err = self.run_main(f"a={self.write('h16.json', h16)},{cut32}")
        self.assertEqual((rc, out), (2, ""))
        self.assertIn("differ in history 16 / 32", err)
        bad = self.write("bad.err", "[bench] settings {history: 16}\n"
                         "[bench] replay separate-fp8, batch 64, W 8: 110.0 us/step\n")
        rc, out, err = self.run_main(f"a={bad}")
        self.assertEqual((rc, out), (2, ""))
        self.assertIn("its '[bench] settings' line is not JSON", err)
        for runs, message in (({"r1": h16, "r2": h32}, "differ in history 16 / 32"),
                              ({"r1": h16, "r2": nano},
                               "differ in shape [128, 64, 128, 8] / [96, 80, 128, 8]")):
            with self.subTest(message=message):
                rc, out, err = self.run_main(f"a={self.write('mixed.json', runs)}")
                self.assertEqual((rc, out), (2, ""))
                self.assertIn(message, err)

    def test_bad_input_is_named(self):
        good = self.write("good.json", bench({("replay bf16", 1, 1): 3.0}))
        combined = self.write("c.json", {"r1-on": bench({("replay bf16", 1, 1): 3.0})})
        cases = [
            ([f"{good}"], "expected LABEL=FILE"),
            ([f"a={self.dir.name}/missing.json"], "cannot read it"),
            ([f"a={self.write('bad.json', '{nope')}"], "not JSON"),
            ([f"a={self.write('list.json', [1, 2])}"], "expected a JSON object, found list"),
            ([f"a={combined}:-off-"], "no bench output (an object with 'rows') whose key contains"),
            ([f"a={good}:r1"], "one bench output has no run keys"),
            ([f"a={good}", f"a={good}"], "two sets have the same label"),
            ([f"a={self.write('row.json', {'rows': [{'name': 'x', 'batch': 1}]})}"],
             "lacks name, batch, window or us_per_step"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                rc, out, err = self.run_main(*args)
                self.assertEqual(rc, 2)
                self.assertEqual(out, "")
                self.assertIn(message, err)


if __name__ == "__main__":
    unittest.main()
