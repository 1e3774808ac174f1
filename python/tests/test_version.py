# SPDX-License-Identifier: Apache-2.0
"""One version number: GM_VERSION_STRING of include/gpumem.h.

gpumem.__version__, the wheel's version (the build backend reads the header;
pyproject.toml declares the version dynamic) and the loaded library's
gm_version() must all be that string.
"""
import os
import re
import sys
import unittest

PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, PYTHON)
sys.path.insert(0, os.path.join(PYTHON, "build_backend"))
os.environ.setdefault("GPUMEM_BACKEND", "sim")

import gpumem  # noqa: E402
import gpumem_build  # noqa: E402

HEADER = os.path.join(PYTHON, "..", "include", "gpumem.h")


def header_version():
    with open(HEADER) as f:
        return re.search(r'#define GM_VERSION_STRING "([^"]+)"', f.read()).group(1)


class TestVersion(unittest.TestCase):
    def test_package_version_is_the_library_version(self):
        self.assertEqual(gpumem.__version__, gpumem.version())
        self.assertIn("__version__", gpumem.__all__)

    def test_package_version_is_the_header_version(self):
        self.assertRegex(gpumem.__version__, r"^\d+\.\d+\.\d+")
        self.assertEqual(gpumem.__version__, header_version())

    def test_build_backend_reads_the_header(self):
        self.assertEqual(gpumem_build.read_version(), header_version())
        with open(os.path.join(PYTHON, "pyproject.toml")) as f:
            project = f.read().split("[project]", 1)[1]
        self.assertIn('dynamic = ["version"]', project)
        self.assertNotRegex(project, r"(?m)^version\s*=", "a second version number in pyproject.toml")

    def test_build_backend_refuses_a_header_without_version(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".h") as f:
            f.write("#define GM_VERSION_MAJOR 1\n")
            f.flush()
            with self.assertRaisesRegex(gpumem_build.BuildError, "GM_VERSION_STRING"):
                gpumem_build.read_version(f.name)

    def test_platform_tag(self):
        import sysconfig
        tag = gpumem_build.platform_tag()
        self.assertRegex(tag, r"^[A-Za-z0-9_]+$")
        self.assertEqual(tag, sysconfig.get_platform().replace("-", "_").replace(".", "_"))


if __name__ == "__main__":
    unittest.main()
