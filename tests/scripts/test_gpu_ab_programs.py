"""scripts/gpu_ab_programs.sh with stand-in programs (a shell script that answers `--version` and
`bench ... -o json` like replayssm): every run of every round is kept, the order rotates, a
program's own environment reaches it, .xz programs, programs of the UNPACK archive and files
without their execute bit run, the comparison tables are made (from a run cut short by its limit,
the rows it reported; one cut before its first row is left out), a caller's RESULTS_DIR is packed
and kept, and a bad argument is refused."""
import json
import os
import stat
import subprocess
import tarfile
import unittest

from script_test_util import SCRIPTS, ScriptTestCase

# us_per_step of the replay row: 10 x FACTOR (default 1), at the batch of `--batches`.
FAKE = """#!/usr/bin/env bash
if [[ $1 == --version ]]; then echo "fake replayssm"; exit 0; fi
b=64
while [[ $# -gt 0 ]]; do [[ $1 == --batches ]] && b=$2; shift; done
t=$((10 * ${FACTOR:-1}))
# CUT_EARLY: the device line, then past BENCH_LIMIT_S before the first row.
if [[ -n ${CUT_EARLY:-} ]]; then
  echo "[bench] NVIDIA H100, copy bandwidth 2954 GB/s" >&2
  exec sleep 30
fi
echo "[bench] replay separate-fp8, batch $b, W 1: $t us/step" >&2
# CUT: report a row, then run past BENCH_LIMIT_S (killed before any JSON is written; exec, so
# that the kill ends the sleep too).
if [[ -n ${CUT:-} ]]; then exec sleep 30; fi
printf '{"command": "replayssm bench", "rows": [{"name": "standard fp32 state", "batch": %s, \
"window": 1, "us_per_step": 100.0}, {"name": "replay separate-fp8", "batch": %s, "window": 1, \
"us_per_step": %s}]}\\n' "$b" "$b" "$t"
"""


class GpuAbPrograms(ScriptTestCase):
    def make_programs(self):
        fake = self.write("fake", FAKE)
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        subprocess.run(["xz", "-k", fake], check=True)  # fake.xz
        noexec = os.path.join(self.dir.name, "packed", "noexec")
        os.makedirs(os.path.dirname(noexec))
        with open(noexec, "w") as f:
            f.write(FAKE)
        os.chmod(noexec, 0o644)
        archive = os.path.join(self.dir.name, "programs.tar.xz")
        with tarfile.open(archive, "w:xz") as t:
            t.add(noexec, arcname="noexec")
        return fake, archive

    def run_script(self, *args, **env):
        out = os.path.join(self.dir.name, "out")
        full_env = dict(os.environ, OUT=out, **env)
        p = subprocess.run(["bash", os.path.join(SCRIPTS, "gpu_ab_programs.sh"), *args],
                           capture_output=True, text=True, env=full_env, cwd=self.dir.name)
        return p, out

    def test_rounds_order_environment_and_tables(self):
        fake, archive = self.make_programs()
        p, out = self.run_script(f"base={fake}", f"knob={fake}.xz+FACTOR=2", "packed=noexec",
                                 UNPACK=archive, BENCH_ARGS="--batches 64;--batches 256",
                                 ROUNDS="2", LIMIT_S="300")
        self.assertEqual(p.returncode, 0, p.stderr)
        with tarfile.open(os.path.join(out, "results.tgz")) as t:
            names = set(os.path.normpath(n) for n in t.getnames())
            runs = {}
            for c in (0, 1):
                for r in (1, 2):
                    for prog in ("base", "knob", "packed"):
                        name = f"bench-c{c}-r{r}-{prog}.json"
                        self.assertIn(name, names)
                        runs[(c, r, prog)] = json.load(t.extractfile("./" + name))
            compare = t.extractfile("./compare-c1.md").read().decode()
        self.assertEqual(runs[(1, 2, "knob")]["rows"][1]["batch"], 256)
        self.assertEqual(runs[(0, 1, "knob")]["rows"][1]["us_per_step"], 20)
        self.assertEqual(runs[(0, 1, "packed")]["rows"][1]["us_per_step"], 10)
        # Round 1 runs base, knob, packed; round 2 starts one later.
        order = [line.split("]")[0][1:] for line in p.stdout.splitlines()
                 if " exit " in line and "bench-c0-" in line]
        self.assertEqual(order, ["base", "knob", "packed", "knob", "packed", "base"])
        self.assertIn("| replay separate-fp8 | 256 | 1 | 10.0 (2 runs, 0.0%) | 20.0 (2 runs, 0.0%) "
                      "| 10.0 (2 runs, 0.0%) | +100.0% | +0.0% |", compare)
        self.assertIn("with FACTOR=2", p.stdout)

    def test_a_callers_results_folder_is_packed_and_kept(self):
        fake, _ = self.make_programs()
        results = os.path.join(self.dir.name, "results")
        os.makedirs(results)
        self.write("results/build.txt", "a caller's log")  # scripts/gpu_ab.sh's build and tests
        # LIMIT_S well above BENCH_LIMIT_S (60): at LIMIT_S=60 a run was skipped whenever the
        # script had used a second before it, as under a loaded CI (`left` < BENCH_LIMIT_S).
        p, out = self.run_script(f"only={fake}", RESULTS_DIR=results, ROUNDS="1", LIMIT_S="300")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.exists(os.path.join(results, "bench-c0-r1-only.json")))
        with tarfile.open(os.path.join(out, "results.tgz")) as t:
            names = set(os.path.normpath(n) for n in t.getnames())
        self.assertLessEqual({"build.txt", "bench-c0-r1-only.json", "compare-c0.md"}, names)

    def test_runs_cut_short_count_with_the_rows_they_reported(self):
        # cut: killed after its row; early: killed after the device line, before any row.
        fake, _ = self.make_programs()
        p, out = self.run_script(f"base={fake}", f"cut={fake}+CUT=1+FACTOR=3",
                                 f"early={fake}+CUT_EARLY=1", BENCH_ARGS="--batches 64",
                                 ROUNDS="1", BENCH_LIMIT_S="2", LIMIT_S="60")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("bench-c0-r1-cut exit 124", p.stdout)
        self.assertIn("bench-c0-r1-early exit 124", p.stdout)
        with tarfile.open(os.path.join(out, "results.tgz")) as t:
            self.assertEqual(t.extractfile("./bench-c0-r1-cut.json").read(), b"")
            compare = t.extractfile("./compare-c0.md").read().decode()
        self.assertIn("| replay separate-fp8 | 64 | 1 | 10.0 | 30.0 | +200.0% |", compare)
        self.assertNotIn("early", compare)  # left out, not a failed table

    def test_bad_arguments_are_refused(self):
        fake, _ = self.make_programs()
        for args in ([], ["base"], ["=x"], ["base=no-such-program"]):
            p, _ = self.run_script(*args)
            self.assertEqual(p.returncode, 2, args)
            self.assertTrue(p.stderr.strip(), args)


if __name__ == "__main__":
    unittest.main()
