"""What the tests of scripts/ share: loading a script as a module, and a test case with a scratch
folder and a way to run a script's main() with its output captured."""
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)  # scripts import each other by name


def load_script(name):
    """scripts/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ScriptTestCase(unittest.TestCase):
    """A scratch folder per test; `write` puts text or JSON in it, `run_main` runs the script's
    main(argv) and returns (exit status, stdout, stderr)."""
    script = None  # the module under test, set by the subclass

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(data if isinstance(data, str) else json.dumps(data))
        return path

    def run_main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = type(self).script.main(list(args))
        return rc, out.getvalue(), err.getvalue()
