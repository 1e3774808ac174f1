# SPDX-License-Identifier: Apache-2.0
"""The build backend (python/build_backend/gpumem_build.py): clear errors when
the library cannot be built, and an sdist that builds a wheel carrying the
library with the C compiler alone (no cmake, no checkout).  The cmake way
from a checkout is python/tests/pip_install.sh."""
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(PYTHON, "build_backend"))

import gpumem_build  # noqa: E402

BUILD = """
import sys
sys.path.insert(0, "build_backend")
import gpumem_build
try:
    print(gpumem_build.build_wheel(sys.argv[1]))
except gpumem_build.BuildError as e:
    print("BuildError:", e)
    sys.exit(3)
"""


def build_wheel(cwd, out, **env):
    # A compiler or builder named by the caller's environment (CC is often
    # set on build machines) must not leak into a test that sets its own.
    full = {k: v for k, v in os.environ.items() if k not in ("CC", "GPUMEM_WHEEL_BUILDER")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", BUILD, out], cwd=cwd, env=full,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


class TestBuildErrors(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def check_error(self, message, **env):
        r = build_wheel(PYTHON, self.tmp, **env)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn(message, r.stdout)
        self.assertEqual(os.listdir(self.tmp), [])

    def test_no_compiler_no_cmake(self):
        self.check_error("needs a C compiler (cc, gcc or clang, or set CC)", PATH=self.tmp)

    def test_missing_cc(self):
        self.check_error("CC=no-such-cc: no such compiler", CC="no-such-cc", GPUMEM_WHEEL_BUILDER="cc")

    def test_forced_cmake_missing(self):
        self.check_error("GPUMEM_WHEEL_BUILDER=cmake but cmake is not installed",
                         PATH=self.tmp, GPUMEM_WHEEL_BUILDER="cmake")

    def test_unknown_builder(self):
        self.check_error("GPUMEM_WHEEL_BUILDER='ninja': use cmake or cc", GPUMEM_WHEEL_BUILDER="ninja")


class TestSdist(unittest.TestCase):
    def test_sdist_builds_a_wheel_with_the_compiler(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        name = gpumem_build.build_sdist(tmp)
        version = gpumem_build.read_version()
        self.assertEqual(name, "gpumem-%s.tar.gz" % version)
        with tarfile.open(os.path.join(tmp, name)) as t:
            names = set(t.getnames())
            for need in ("pyproject.toml", "build_backend/gpumem_build.py", "gpumem/__init__.py",
                         "PKG-INFO", "native/include/gpumem.h", "native/gpumem.map", "native/src/api/pool.c",
                         "native/src/backend/sim.c", "gpumem/torch_allocator.cpp", "gpumem/include/gpumem.h"):
                self.assertIn("gpumem-%s/%s" % (version, need), names)
            t.extractall(tmp)
        if os.environ.get("GM_UNDER_VALGRIND") or not (shutil.which(os.environ.get("CC", "cc").split()[0])):
            self.skipTest("no C compiler (or under valgrind): the sdist's build is not run")
        src = os.path.join(tmp, "gpumem-%s" % version)
        out = os.path.join(tmp, "dist")
        os.mkdir(out)
        r = build_wheel(src, out, GPUMEM_WHEEL_BUILDER="")  # no CMakeLists.txt: the compiler
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("cmake -S", r.stderr)
        wheel = r.stdout.strip().splitlines()[-1]
        self.assertEqual(wheel, "gpumem-%s-py3-none-%s.whl" % (version, gpumem_build.platform_tag()))
        with zipfile.ZipFile(os.path.join(out, wheel)) as z:
            self.assertEqual(z.read("gpumem/libgpumem.so")[:4], b"\x7fELF")
            # What gpumem.torch compiles its native allocator from.
            self.assertIn(b"gm_torch_native_install", z.read("gpumem/torch_allocator.cpp"))
            self.assertIn(b"GM_VERSION_STRING", z.read("gpumem/include/gpumem.h"))
            z.extractall(os.path.join(tmp, "site"))
        code = ("import gpumem, os; assert gpumem.library_path() == os.path.join(os.path.dirname("
                "gpumem.__file__), 'libgpumem.so'); assert gpumem.__version__ == gpumem.version(); "
                "a = gpumem.alloc(4096); a.memset(1); a.free(); import gpumem.torch as t; "
                "assert t._header_dir() == os.path.join(os.path.dirname(gpumem.__file__), 'include'); "
                "print('ok')")
        env = dict(os.environ, PYTHONPATH=os.path.join(tmp, "site"), GPUMEM_BACKEND="sim")
        env.pop("GPUMEM_LIBRARY", None)
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(r.stdout.strip(), "ok", r.stderr)


if __name__ == "__main__":
    unittest.main()
