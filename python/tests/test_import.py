# SPDX-License-Identifier: Apache-2.0
"""`import gpumem` alone makes every submodule the documents use reachable
(gpumem.torch, gpumem.cupy, gpumem.share), in a fresh interpreter, without
loading a framework or needing a GPU."""
import os
import subprocess
import sys
import textwrap
import unittest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


class ImportTest(unittest.TestCase):
    def run_fresh(self, code, env=None):
        e = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        e.update(env or {})
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                              capture_output=True, text=True, timeout=120)

    def test_submodules_reachable_after_import_gpumem(self):
        r = self.run_fresh("""
            import sys, gpumem
            for name in ("torch", "cupy", "share"):
                mod = getattr(gpumem, name, None)
                assert mod is not None and mod.__name__ == "gpumem." + name, name
            print(gpumem.share.Buffer.__name__, gpumem.share.READ_ONLY)
            # the adapters import their frameworks only when enabled
            assert "torch" not in sys.modules and "cupy" not in sys.modules
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "Buffer 1")

    def test_import_without_a_device_or_library(self):
        # A library path that does not exist: importing must still work (the
        # library is needed by calls, not by the import); the first call says why.
        r = self.run_fresh("""
            import gpumem
            gpumem.share
            try:
                gpumem.stats()
            except Exception as e:
                print(type(e).__name__)
            else:
                print("no error")
        """, env={"GPUMEM_LIBRARY": "/nonexistent/libgpumem.so", "GPUMEM_BACKEND": "sim"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotEqual(r.stdout.strip(), "no error")


if __name__ == "__main__":
    unittest.main()
