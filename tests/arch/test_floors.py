#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests of scripts/floors.py, the floors check (ctest arch/floors_script).

Most tests build a tiny fake tree in a temporary folder: src/FLOORS, a few C
files and headers, and for each "object" its dependency file (X.c.o.d, as the
compiler writes it) and its symbol table, written as `nm` prints it and read
back with `--nm cat`.  One test compiles a fake tree with the real compiler
and nm when CC (and NM) are in the environment, as ctest sets them.

Run: python3 tests/arch/test_floors.py [-v]
"""
import io
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "floors.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import floors  # noqa: E402


def run_floors(args):
    """floors.main(args): its exit status and what it printed."""
    out = io.StringIO()
    old = sys.stdout
    sys.stdout = out
    try:
        rc = floors.main(args)
    finally:
        sys.stdout = old
    return rc, out.getvalue()


def nm_text(defined=(), undefined=()):
    return "".join(["0000000000000000 T %s\n" % s for s in defined] +
                   ["                 U %s\n" % s for s in undefined])


class FakeTree:
    """A source tree and a build folder of fake objects."""

    def __init__(self, floors_text):
        self.dir = tempfile.mkdtemp(prefix="floors-test-")
        self.root = os.path.join(self.dir, "repo")
        self.objdir = os.path.join(self.dir, "build", "CMakeFiles", "lib.dir")
        self.write("src/FLOORS", floors_text)
        os.makedirs(os.path.join(self.root, "include"), exist_ok=True)

    def write(self, rel, text):
        p = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)

    def unit(self, src, text, headers=(), defined=(), undefined=()):
        """A C file, and its object: the headers the compiler read for it
        (paths relative to the root), the symbols it defines and uses."""
        self.write(src, text)
        obj = os.path.join(self.objdir, src + ".o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        with open(obj, "w") as f:
            f.write(nm_text(defined, undefined))
        deps = [os.path.join(self.root, src)] + [os.path.join(self.root, h) for h in headers]
        with open(obj + ".d", "w") as f:
            f.write("%s: \\\n %s\n" % (obj, " \\\n ".join(deps)))

    def run(self, *args):
        return run_floors(["--root", self.root, "--nm", "cat", self.objdir] + list(args))

    def close(self):
        shutil.rmtree(self.dir)


# low < mid < high; low/a.c includes mid/m.h and calls mid/m.c (up), and the
# four files of low/ call each other in a circle a -> b -> c -> d -> a.
FLOORS3 = "# test floors\nlow\nmid   # the middle\nhigh\n"


def broken_tree():
    t = FakeTree(FLOORS3)
    t.write("src/mid/m.h", "#pragma once\nint m(void);\n")
    t.write("src/low/low.h", '#pragma once\n#include "base.h"\n')
    t.write("src/low/base.h", "#pragma once\n")
    t.write("src/high/h.h", "#pragma once\n")
    t.unit("src/low/a.c", '#include "low.h"\n#include "mid/m.h"\n'
           '#ifdef NEVER\n#include "high/h.h"\n#endif\nint a(void) { return m() + b(); }\n',
           headers=["src/low/low.h", "src/low/base.h", "src/mid/m.h"],
           defined=["a"], undefined=["m", "b", "printf"])
    t.unit("src/low/b.c", "int b(void) { return c(); }\n", defined=["b"], undefined=["c"])
    t.unit("src/low/c.c", "int c(void) { return d(); }\n", defined=["c"], undefined=["d"])
    t.unit("src/low/d.c", "int d(void) { return a(); }\n", defined=["d"], undefined=["a"])
    t.unit("src/mid/m.c", '#include "mid/m.h"\nint m(void) { return 0; }\n',
           headers=["src/mid/m.h"], defined=["m"])
    t.unit("src/high/h.c", '#include "../mid/m.h"\nint h(void) { return m(); }\n',
           headers=["src/mid/m.h"], defined=["h"], undefined=["m"])
    return t


class TreeTest(unittest.TestCase):
    def cleaned(self, t):
        """The FakeTree t, removed after the test."""
        self.addCleanup(t.close)
        return t

    def assert_run(self, t, args, rc, *lines):
        """t.run(*args) exits with rc and prints each of `lines`; returns its output."""
        got, out = t.run(*args)
        self.assertEqual(got, rc, out)
        for line in lines:
            self.assertIn(line, out)
        return out

    def test_upward_edge_and_four_file_cycle_fail_strict(self):
        t = self.cleaned(broken_tree())
        out = self.assert_run(t, ["--strict", "--max-file-cycle", "3"], 1,
                              "low -> mid (up)",
                              "include  low/a.c:2  mid/m.h",
                              "calls    low/a.c -> mid/m.c: m\n",
                              "edges that go up: 1 between folders, 2 between files",
                              "file call cycles: 1; largest: 4 files",
                              "4 files: low/a low/b low/c low/d",
                              "a call cycle of 4 files (limit 3)",
                              # high/h.c includes ../mid/m.h (relative to its folder): down, fine
                              "high      (3) -> mid       (2)  includes   1  calls   1")
        # the include compiled out (#ifdef NEVER) is no edge; printf is no file
        self.assertNotIn("low -> high", out)
        self.assertNotIn("printf", out)

    def test_report_mode_exits_zero_with_the_same_findings(self):
        t = self.cleaned(broken_tree())
        self.assert_run(t, ["--report", "--max-file-cycle", "3"], 0,
                        "low -> mid (up)", "floors broken: 1 folder edges go up")
        self.assert_run(t, [], 0)  # report is the default

    def test_objects_as_one_list(self):
        t = self.cleaned(broken_tree())
        objs = [os.path.join(t.objdir, "src", f) for f in ("low/a.c.o", "mid/m.c.o")]
        rc = floors.main(["--root", t.root, "--nm", "cat", "--strict",
                          "--objects=" + os.pathsep.join(objs)])
        self.assertEqual(rc, 1)
        self.assertEqual(floors.main(["--root", t.root, "--nm", "cat", "--strict",
                                      "--objects=" + objs[1]]), 0)

    def test_without_dependency_file_every_include_line_counts(self):
        t = self.cleaned(broken_tree())
        os.remove(os.path.join(t.objdir, "src", "low", "a.c.o.d"))
        self.assert_run(t, ["--strict"], 1,
                        "note: no dependency file for 1 objects (src/low/a.c...)",
                        "include  low/a.c:4  high/h.h")

    def test_file_cycle_limit_alone(self):
        t = self.cleaned(broken_tree())
        # the same tree with mid put below low: no edge goes up any more
        t.write("src/FLOORS", "mid\nlow\nhigh\n")
        self.assert_run(t, ["--strict", "--max-file-cycle", "4"], 0, "floors hold")
        self.assert_run(t, ["--strict", "--max-file-cycle", "3"], 1,
                        "floors broken: a call cycle of 4 files (limit 3)")

    def test_folder_cycle_and_sideways(self):
        t = self.cleaned(FakeTree("base\nleft right\n"))
        t.unit("src/left/l.c", "", defined=["l"], undefined=["r"])
        t.unit("src/right/r.c", "", defined=["r"], undefined=["l"])
        self.assert_run(t, ["--strict"], 1, "left -> right (sideways)", "right -> left (sideways)",
                        "2 folders: left right", "1 folder cycles")
        # allowed both ways: the cycle within the floor is no violation
        t.write("src/FLOORS", "base\nleft right\nallow left -> right\nallow right -> left\n")
        self.assert_run(t, ["--strict"], 0, "allowed sideways: left -> right")
        # one way allowed: the other still fails
        t.write("src/FLOORS", "base\nleft right\nallow left -> right\n")
        out = self.assert_run(t, ["--strict"], 1, "right -> left (sideways)")
        self.assertNotIn("left -> right (sideways)", out)

    def test_folder_on_no_floor_fails_strict(self):
        t = self.cleaned(FakeTree("low\n"))
        t.unit("src/low/a.c", "", defined=["a"])
        t.unit("src/new/n.c", "", defined=["n"], undefined=["a"])
        self.assert_run(t, ["--strict"], 1, "folders on no floor: new")

    def test_bad_inputs_exit_2(self):
        t = self.cleaned(FakeTree("low\nlow\n"))
        t.unit("src/low/a.c", "", defined=["a"])
        self.assertEqual(t.run()[0], 2)
        t.write("src/FLOORS", "low\n")
        self.assertEqual(t.run(os.path.join(t.dir, "nothing"))[0], 2)
        empty = os.path.join(t.dir, "empty")
        os.mkdir(empty)
        # no objects in it
        self.assertEqual(floors.main(["--root", t.root, "--nm", "cat", empty]), 2)


class PartsTest(unittest.TestCase):
    def test_parse_floors(self):
        f = floors.parse_floors("# c\n\na   # x\nb c\nallow c -> b\nd\n")
        self.assertEqual(f.floor, {"a": 0, "b": 1, "c": 1, "d": 2})
        self.assertTrue(f.is_up("a", "d"))
        self.assertFalse(f.is_up("d", "a"))
        self.assertTrue(f.is_forbidden_sideways("b", "c"))
        self.assertFalse(f.is_forbidden_sideways("c", "b"))
        for bad in ("a\na\n", "a\nb\nallow a -> b\n", "a b\nallow a -> z\n", "", "a/b\n"):
            with self.assertRaises(floors.InputError, msg=bad):
                floors.parse_floors(bad)

    def test_parse_depfile(self):
        t, deps = floors.parse_depfile(
            "x.c.o: /r/src/x.c /r/src/a\\ b.h \\\n /r/src/c.h\n/r/src/c.h:\n")
        self.assertEqual(t, "x.c.o")
        self.assertEqual(deps, ["/r/src/x.c", "/r/src/a b.h", "/r/src/c.h"])

    def test_parse_nm(self):
        d, u = floors.parse_nm("0000 T f\n0010 t local\n         U g\n0020 D data\n"
                               "0030 W weak\n         w wundef\n0040 B bss\n")
        self.assertEqual(d, {"f", "data", "weak", "bss"})
        self.assertEqual(u, {"g", "wundef"})

    def test_sccs(self):
        g = {1: {2}, 2: {3}, 3: {1, 4}, 4: {5}, 5: {4}, 6: {1}}
        self.assertEqual(floors.sccs(range(1, 8), g), [[1, 2, 3], [4, 5]])
        self.assertEqual(floors.sccs([1, 2], {1: {2}}), [])
        # deep chain: no recursion limit
        n = 5000
        chain = {i: {i + 1} for i in range(n)}
        chain[n] = {0}
        self.assertEqual(len(floors.sccs(range(n + 1), chain)[0]), n + 1)


@unittest.skipUnless(os.environ.get("CC"), "CC not set: no compiler to build a real tree with")
class RealBuildTest(unittest.TestCase):
    """A fake tree built by the real compiler (-MD) and read with the real nm."""

    def test_real_compiler_and_nm(self):
        t = FakeTree("low\nhigh\n")
        self.addCleanup(t.close)
        t.write("src/high/h.h", "#ifndef H_H\n#define H_H\nint h(void);\n#endif\n")
        t.write("src/low/l.h", '#ifndef L_H\n#define L_H\n#include "high/h.h"\nint l(void);\n#endif\n')
        t.write("src/low/a.c", '#include "low/l.h"\n#include "high/h.h"\nint a(void) { return h() + b(); }\n')
        t.write("src/low/b.c", '#include "low/l.h"\nint a(void);\nint b(void) { return a(); }\n')
        t.write("src/high/h.c", '#include "high/h.h"\nint h(void) { return 1; }\n')
        for src in ("src/low/a.c", "src/low/b.c", "src/high/h.c"):
            obj = os.path.join(t.objdir, src + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            subprocess.check_call([os.environ["CC"], "-c", "-MD", "-MT", obj, "-MF", obj + ".d",
                                   "-I" + os.path.join(t.root, "include"),
                                   "-I" + os.path.join(t.root, "src"),
                                   "-Wno-implicit-function-declaration",
                                   "-o", obj, os.path.join(t.root, src)])
        rc, out = run_floors(["--root", t.root, "--nm", os.environ.get("NM") or "nm",
                              "--strict", "--max-file-cycle", "1", t.objdir])
        self.assertEqual(rc, 1, out)
        self.assertIn("low -> high (up)", out)
        self.assertIn("include  low/a.c:2  high/h.h", out)
        self.assertIn("include  low/l.h:3  high/h.h", out)
        self.assertIn("calls    low/a.c -> high/h.c: h\n", out)
        self.assertIn("2 files: low/a low/b", out)


if __name__ == "__main__":
    unittest.main()
