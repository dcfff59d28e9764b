"""scripts/gpu_run.sh's REQUIRE_GPU guard, with a stand-in nvidia-smi and replayssm on PATH: on a
card whose name does not contain it (or where nvidia-smi finds no GPU) the script exits 3 before
any step; on one that does, or without the guard, its steps run."""
import os
import shutil
import stat
import subprocess
import unittest

from script_test_util import SCRIPTS, ScriptTestCase

ROOT = os.path.dirname(os.path.abspath(SCRIPTS))
SMI = """#!/usr/bin/env bash
echo "name, clocks.current.sm [MHz], clocks.current.memory [MHz], temperature.gpu"
echo "NVIDIA H100 80GB HBM3, 345 MHz, 2619 MHz, 38"
"""
# nvidia-smi on a machine without a GPU or driver: a message on stderr, no CSV, non-zero.
NO_GPU_SMI = """#!/usr/bin/env bash
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""
# Records its arguments; prints no table (bench_table.py's failure does not stop the script).
FAKE = """#!/usr/bin/env bash
echo "$@" >> "$CALLS"
"""


class GpuRunGuard(ScriptTestCase):
    def run_script(self, gpu=True, **env):
        bin_dir = os.path.join(self.dir.name, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        tools = {"replayssm": FAKE, "nvidia-smi": SMI if gpu else NO_GPU_SMI}
        for name, text in tools.items():
            path = os.path.join(bin_dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        # PATH: the stand-ins first (a real nvidia-smi must not answer), then the folders of bash,
        # coreutils, git and python3.
        keep = {os.path.dirname(shutil.which(t)) for t in ("bash", "timeout", "git", "python3")}
        out = os.path.join(self.dir.name, "out")
        calls = os.path.join(self.dir.name, "calls")
        full_env = dict(os.environ, OUT=out, CALLS=calls,
                        REPLAYSSM_BIN=os.path.join(bin_dir, "replayssm"),
                        PATH=os.pathsep.join([bin_dir, *sorted(keep)]), **env)
        p = subprocess.run(["bash", os.path.join(SCRIPTS, "gpu_run.sh"), "table"],
                           capture_output=True, text=True, env=full_env, cwd=ROOT)
        ran = ""
        if os.path.exists(calls):
            with open(calls) as f:
                ran = f.read()
        return p, out, ran

    def test_another_card_runs_no_step(self):
        p, out, ran = self.run_script(REQUIRE_GPU="H200")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("REQUIRE_GPU=H200", p.stderr)
        self.assertEqual(ran, "")
        self.assertFalse(os.path.exists(os.path.join(out, "table.txt")))

    def test_no_gpu_runs_no_step(self):
        p, out, ran = self.run_script(gpu=False, REQUIRE_GPU="H100")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertEqual(ran, "")

    def test_the_named_card_runs_the_steps(self):
        for env in ({"REQUIRE_GPU": "h100"}, {}):  # the name's case does not matter; no guard
            with self.subTest(env=env):
                p, out, ran = self.run_script(**env)
                self.assertNotEqual(p.returncode, 3, p.stderr)
                self.assertIn("bench --backend cuda --check", ran)
                self.assertTrue(os.path.exists(os.path.join(out, "table.txt")))
                os.remove(os.path.join(self.dir.name, "calls"))


if __name__ == "__main__":
    unittest.main()
