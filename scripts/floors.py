#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""floors.py — check that the library's folders form floors, from the build.

src/FLOORS lists the folders of src/ from the bottom floor up.  A folder may
include and call folders on lower floors only: an edge to a higher floor is
"up", an edge to another folder of the same floor is "sideways" and allowed
only where FLOORS says `allow A -> B`.

The edges come from the build, not from reading the code:

  includes  each object's dependency file (the compiler's -MD output, X.o.d or
            X.d beside X.o) names the headers the build really read for that
            translation unit; the `#include "..."` lines of those files, resolved
            the way the compiler does (the including file's folder, then each
            include directory), say which file includes which.  An include in a
            branch the build compiled out is not an edge.
  calls     `nm` over the objects: a symbol one object leaves undefined and
            another defines is an edge between their C files (functions and
            data alike).

From these the script prints the folder edges with their counts, every edge
that goes up or sideways with the files, lines and symbols that make it, the
cycles between folders (strongly connected components, includes and calls
together) and the cycles of calls between C files, largest first.

Usage:
  floors.py [options] OBJECT_OR_DIR...     (a directory: every *.o under it)
    --objects O1:O2        objects as one list (CMake's $<TARGET_OBJECTS>)
    --floors FILE          the floors file (default: src/FLOORS of the root)
    --root DIR             the source tree (default: the parent of scripts/)
    -I DIR                 an include directory of the build, in order
                           (default: include and src of the root)
    --include-path D1:D2   the same, as one list (the build's own list)
    --nm PROGRAM           nm to run (default: nm)
    --strict               exit 1 on an up or sideways edge, a folder cycle,
                           a folder missing from FLOORS, or a file cycle
                           larger than --max-file-cycle
    --max-file-cycle N     the largest call cycle between C files allowed in
                           strict mode (default: no limit)
    --report               report only: exit 0 whatever it finds (default)

Exit status: 0 clean (or --report), 1 a violation in --strict mode, 2 a bad
floors file or unreadable inputs.  Python 3 standard library only.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = "(src)"           # the folder name of a file directly in src/


class InputError(Exception):
    """A floors file or an input the script cannot use (exit 2)."""


# ---- the floors file --------------------------------------------------------

class Floors:
    """FLOORS: one line per floor, bottom first; `allow A -> B` lines."""

    def __init__(self):
        self.floor = {}         # folder -> floor index (0 = bottom)
        self.lines = []         # floor index -> folders, as written
        self.allowed = set()    # (a, b): a may use b, both on one floor

    def is_up(self, a, b):
        return self.floor[b] > self.floor[a]

    def is_forbidden_sideways(self, a, b):
        return (a != b and self.floor[a] == self.floor[b]
                and (a, b) not in self.allowed)

    def describe(self):
        return " < ".join(" ".join(f) for f in self.lines)


ALLOW_RE = re.compile(r"^allow\s+([\w.()-]+)\s*->\s*([\w.()-]+)$")
NAME_RE = re.compile(r"^[\w.()-]+$")


def parse_floors(text, name="FLOORS"):
    floors = Floors()
    allows = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = ALLOW_RE.match(line)
        if m:
            allows.append((n, m.group(1), m.group(2)))
            continue
        folders = line.split()
        for f in folders:
            if not NAME_RE.match(f):
                raise InputError("%s:%d: %r is not a folder name" % (name, n, f))
            if f in floors.floor:
                raise InputError("%s:%d: folder %s is already on floor %d"
                                 % (name, n, f, floors.floor[f] + 1))
            floors.floor[f] = len(floors.lines)
        floors.lines.append(folders)
    for n, a, b in allows:
        for f in (a, b):
            if f not in floors.floor:
                raise InputError("%s:%d: allow names %s, which is on no floor" % (name, n, f))
        if a == b or floors.floor[a] != floors.floor[b]:
            raise InputError("%s:%d: allow %s -> %s: only two folders of one floor "
                             "may be allowed to use each other" % (name, n, a, b))
        floors.allowed.add((a, b))
    if not floors.lines:
        raise InputError("%s: no floor listed" % name)
    return floors


# ---- compiler dependency files and include lines -----------------------------

def parse_depfile(text):
    """Make-rule text of `cc -MD` -> (target, [prerequisites])."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    # The first rule only (-MP adds empty `header:` rules after it).
    rule = text.split("\n", 1)[0]
    target, sep, rest = rule.partition(": ")
    if not sep:
        target, sep, rest = rule.partition(":")
    words, cur, i = [], "", 0
    while i < len(rest):
        c = rest[i]
        if c == "\\" and i + 1 < len(rest) and rest[i + 1] in " #":
            cur += rest[i + 1]
            i += 2
            continue
        if c == "$" and rest[i + 1:i + 2] == "$":
            cur += "$"
            i += 2
            continue
        if c.isspace():
            if cur:
                words.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        words.append(cur)
    return target.strip(), words


INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def quote_includes(text):
    """[(line number, spelling)] of the `#include "..."` lines of a file."""
    return [(n, m.group(1)) for n, line in enumerate(text.splitlines(), 1)
            for m in [INCLUDE_RE.match(line)] if m]


def resolve_include(including, spelling, include_dirs, exists=os.path.isfile):
    """The file `#include "spelling"` in file `including` opens, or None."""
    for d in [os.path.dirname(including)] + list(include_dirs):
        p = os.path.normpath(os.path.join(d, spelling))
        if exists(p):
            return p
    return None


# ---- nm ---------------------------------------------------------------------

def parse_nm(text):
    """Output of `nm FILE` -> (defined global symbols, undefined symbols)."""
    defined, undefined = set(), set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, sym = parts[-2], parts[-1]
        if len(kind) != 1:
            continue
        if kind in "Uwv":           # undefined, weak undefined
            undefined.add(sym)
        elif kind.isupper() and kind not in "AN":
            defined.add(sym)        # T D B R V W C G S I (not absolute, debug)
    return defined, undefined - defined


# ---- graphs -------------------------------------------------------------------

def sccs(nodes, succ):
    """Tarjan's strongly connected components (iterative); only those of more
    than one node, each sorted, largest first."""
    index, low, on, stack, out = {}, {}, set(), [], []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            pushed = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    pushed = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if pushed:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    out.sort(key=lambda c: (-len(c), c))
    return out


# ---- the model: what the build says ---------------------------------------------

class Model:
    """Files are paths relative to the root ("src/core/pool.c")."""

    def __init__(self, src_prefix="src/"):
        self.src_prefix = src_prefix
        self.objects = []        # C files with an object
        self.includes = {}       # (file, header) -> [line numbers]
        self.calls = {}          # (file, file) -> set of symbols
        self.notes = []          # what could not be read, said once

    def folder(self, path):
        rest = path[len(self.src_prefix):]
        return rest.split("/", 1)[0] if "/" in rest else TOP

    def in_src(self, path):
        return path.startswith(self.src_prefix)

    def add_calls(self, symbols):
        """symbols: {file: (defined, undefined)}."""
        owner = {}
        for f in sorted(symbols):
            for s in symbols[f][0]:
                owner.setdefault(s, f)
        for f in sorted(symbols):
            for s in symbols[f][1]:
                g = owner.get(s)
                if g is not None and g != f:
                    self.calls.setdefault((f, g), set()).add(s)

    def add_includes(self, tu, read, read_file, resolve):
        """Walk the quote includes from C file `tu`.  read: the set of files
        the build read for it (None: unknown, take every include);
        read_file(path) -> text; resolve(including, spelling) -> path."""
        seen, todo = {tu}, [tu]
        while todo:
            f = todo.pop()
            try:
                text = read_file(f)
            except OSError as e:
                self.notes.append("cannot read %s: %s" % (f, e.strerror))
                continue
            for n, spelling in quote_includes(text):
                h = resolve(f, spelling)
                if h is None or (read is not None and h not in read):
                    continue        # not found, or compiled out
                if not self.in_src(h):
                    continue        # the public header: on no floor
                lines = self.includes.setdefault((f, h), [])
                if n not in lines:
                    lines.append(n)
                if h not in seen:
                    seen.add(h)
                    todo.append(h)


def find_objects(args):
    objs = []
    for a in args:
        if os.path.isdir(a):
            for d, dirs, files in os.walk(a):
                dirs.sort()
                objs += [os.path.join(d, f) for f in sorted(files) if f.endswith(".o")]
        elif os.path.isfile(a):
            objs.append(a)
        else:
            raise InputError("no such object file or directory: %s" % a)
    if not objs:
        raise InputError("no object files in %s" % " ".join(args))
    return objs


def depfile_of(obj):
    for d in (obj + ".d", os.path.splitext(obj)[0] + ".d"):
        if os.path.isfile(d):
            return d
    return None


def source_of(obj, prereqs, root):
    """The C file an object was compiled from, relative to root."""
    for p in prereqs[:1]:
        p = p if os.path.isabs(p) else os.path.join(os.path.dirname(obj), p)
        if p.endswith(".c"):
            return os.path.relpath(os.path.normpath(p), root)
    # CMake names objects DIR.dir/<path of the source>.o
    m = re.search(r"\.dir/(.+\.c)\.o$", obj.replace(os.sep, "/"))
    if m:
        return m.group(1)
    return None


def absolutize(p, obj):
    """A path of a dependency file, relative to the directory the compiler
    ran in: try each folder from the object's up."""
    if os.path.isabs(p):
        return os.path.normpath(p)
    d = os.path.dirname(os.path.abspath(obj))
    while True:
        q = os.path.normpath(os.path.join(d, p))
        if os.path.exists(q):
            return q
        up = os.path.dirname(d)
        if up == d:
            return None
        d = up


def build_model(objs, root, include_dirs, nm):
    root = os.path.abspath(root)
    model = Model()
    symbols = {}
    dep_missing = []
    for obj in objs:
        dep = depfile_of(obj)
        prereqs = []
        if dep:
            with open(dep, encoding="utf-8", errors="replace") as f:
                prereqs = parse_depfile(f.read())[1]
        src = source_of(obj, prereqs, root)
        if src is None or not model.in_src(src):
            continue                # not a library C file
        try:
            r = subprocess.run([nm, obj], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True)
        except OSError as e:
            raise InputError("cannot run %s: %s" % (nm, e.strerror))
        if r.returncode != 0:
            raise InputError("%s %s failed: %s" % (nm, obj, r.stderr.strip()))
        symbols[src] = parse_nm(r.stdout)
        model.objects.append(src)
        if dep:
            read = set()
            for p in prereqs:
                q = absolutize(p, obj)
                if q and q.startswith(root + os.sep):
                    read.add(os.path.relpath(q, root))
        else:
            read = None
            dep_missing.append(src)

        def read_file(rel):
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                return f.read()

        def resolve(including, spelling):
            p = resolve_include(os.path.join(root, including), spelling,
                                [os.path.join(root, d) for d in include_dirs])
            if p is None:
                return None
            p = os.path.relpath(p, root)
            return None if p.startswith("..") else p

        model.add_includes(src, read, read_file, resolve)
    if not model.objects:
        raise InputError("none of the %d objects was compiled from a C file in src/" % len(objs))
    if dep_missing:
        model.notes.append("no dependency file for %d objects (%s...): every include "
                           "line of theirs counted" % (len(dep_missing), dep_missing[0]))
    model.add_calls(symbols)
    model.objects.sort()
    return model


# ---- the findings --------------------------------------------------------------

class Findings:
    pass


def analyse(model, floors, max_file_cycle=None):
    fo = model.folder
    res = Findings()
    # folder -> folder: include lines and call symbols, with their file pairs
    inc, cal = {}, {}
    for (a, b), lines in model.includes.items():
        if fo(a) != fo(b):
            inc.setdefault((fo(a), fo(b)), []).append((a, b, lines))
    for (a, b), syms in model.calls.items():
        if fo(a) != fo(b):
            cal.setdefault((fo(a), fo(b)), []).append((a, b, syms))
    res.inc, res.cal = inc, cal
    folders = {fo(f) for f in model.objects}
    folders |= {fo(f) for pair in model.includes for f in pair}
    res.folders = sorted(folders)
    res.unknown = sorted(f for f in folders if f not in floors.floor)

    def kind(a, b):
        if a not in floors.floor or b not in floors.floor:
            return None
        if floors.is_up(a, b):
            return "up"
        if floors.is_forbidden_sideways(a, b):
            return "sideways"
        return None
    res.pairs = sorted(set(inc) | set(cal),
                       key=lambda p: (floors.floor.get(p[0], -1), p[0],
                                      floors.floor.get(p[1], -1), p[1]))
    res.kind = {p: kind(*p) for p in res.pairs}
    res.bad = [p for p in res.pairs if res.kind[p]]

    succ = {}
    for a, b in res.pairs:
        succ.setdefault(a, set()).add(b)
    res.folder_cycles = sccs(folders, succ)
    res.include_cycles = sccs(folders, {a: {b for (x, b) in inc if x == a} for a in folders})
    # a cycle of allowed sideways edges within one floor is no violation
    res.bad_folder_cycles = [c for c in res.folder_cycles
                             if any(x in res.unknown for x in c)
                             or any(res.kind.get((x, y)) for x in c for y in c
                                    if y in succ.get(x, ()))]
    fsucc = {}
    for a, b in model.calls:
        fsucc.setdefault(a, set()).add(b)
    res.file_cycles = sccs(model.objects, fsucc)
    res.largest = res.file_cycles[0] if res.file_cycles else []
    res.max_file_cycle = max_file_cycle
    res.file_cycle_too_big = (max_file_cycle is not None and len(res.largest) > max_file_cycle)
    res.failed = bool(res.bad or res.bad_folder_cycles or res.unknown or res.file_cycle_too_big)
    return res


def short(path, model):
    return path[len(model.src_prefix):] if model.in_src(path) else path


def render(model, floors, res, floors_name, out):
    w = out.write
    fl = floors.floor
    w("floors (%s, bottom first): %s\n" % (floors_name, floors.describe()))
    for a, b in sorted(floors.allowed):
        w("  allowed sideways: %s -> %s\n" % (a, b))
    w("build: %d C files, %d include edges between files, %d file-to-file call edges\n"
      % (len(model.objects), len(model.includes), len(model.calls)))
    for n in model.notes:
        w("note: %s\n" % n)
    if res.unknown:
        w("folders on no floor: %s\n" % " ".join(res.unknown))

    w("\nfolder edges (include lines; symbols used, over file pairs):\n")
    for p in res.pairs:
        ni = sum(len(l) for _, _, l in res.inc.get(p, ()))
        ns = sum(len(s) for _, _, s in res.cal.get(p, ()))
        nf = len(res.cal.get(p, ()))
        mark = {"up": "  UP", "sideways": "  SIDEWAYS"}.get(res.kind[p], "")
        fa = "%d" % (fl[p[0]] + 1) if p[0] in fl else "?"
        fb = "%d" % (fl[p[1]] + 1) if p[1] in fl else "?"
        w("  %-9s (%s) -> %-9s (%s)  includes %3d  calls %3d over %2d file pairs%s\n"
          % (p[0], fa, p[1], fb, ni, ns, nf, mark))

    for k in ("up", "sideways"):
        ps = [p for p in res.bad if res.kind[p] == k]
        nf = sum(len(res.inc.get(p, ())) + len(res.cal.get(p, ())) for p in ps)
        w("%sedges that go %s: %d between folders, %d between files (include edges "
          "and calling file pairs)\n" % ("\n" if k == "up" else "", k, len(ps), nf))
    for p in res.bad:
        w("  %s -> %s (%s)\n" % (p[0], p[1], res.kind[p]))
        for a, b, lines in sorted(res.inc.get(p, ())):
            w("    include  %s:%s  %s\n" % (short(a, model), ",".join(map(str, sorted(lines))),
                                           short(b, model)))
        for a, b, syms in sorted(res.cal.get(p, ())):
            w("    calls    %s -> %s: %s\n" % (short(a, model), short(b, model),
                                              " ".join(sorted(syms))))

    w("\nfolder cycles (includes and calls): %d\n" % len(res.folder_cycles))
    for c in res.folder_cycles:
        w("  %d folders: %s\n" % (len(c), " ".join(c)))
    w("folder include cycles: %d\n" % len(res.include_cycles))
    for c in res.include_cycles:
        w("  %d folders: %s\n" % (len(c), " ".join(c)))

    w("\nfile call cycles: %d; largest: %d files\n" % (len(res.file_cycles), len(res.largest)))
    for c in res.file_cycles:
        w("  %d files: %s\n" % (len(c), " ".join(short(f, model)[:-2] for f in c)))

    why = []
    for k in ("up", "sideways"):
        n = sum(1 for p in res.bad if res.kind[p] == k)
        if n:
            why.append("%d folder edges go %s" % (n, k))
    if res.bad_folder_cycles:
        why.append("%d folder cycles" % len(res.bad_folder_cycles))
    if res.unknown:
        why.append("%d folders on no floor" % len(res.unknown))
    if res.file_cycle_too_big:
        why.append("a call cycle of %d files (limit %d)" % (len(res.largest), res.max_file_cycle))
    w("\n%s\n" % ("floors broken: " + "; ".join(why) if why else "floors hold"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("objects", nargs="*")
    ap.add_argument("--objects", dest="object_list", default="")
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--floors")
    ap.add_argument("-I", dest="include_dirs", action="append", default=[])
    ap.add_argument("--include-path", default="")
    ap.add_argument("--nm", default="nm")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--strict", action="store_true")
    mode.add_argument("--report", action="store_true")
    ap.add_argument("--max-file-cycle", type=int)
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root)
    floors_path = a.floors or os.path.join(root, "src", "FLOORS")
    include_dirs = a.include_dirs + [d for d in a.include_path.split(os.pathsep) if d]
    include_dirs = include_dirs or ["include", "src"]
    try:
        try:
            with open(floors_path, encoding="utf-8") as f:
                floors = parse_floors(f.read(), os.path.relpath(floors_path, root))
        except OSError as e:
            raise InputError("cannot read %s: %s" % (floors_path, e.strerror))
        objects = a.objects + [o for o in a.object_list.split(os.pathsep) if o]
        if not objects:
            raise InputError("no objects given")
        model = build_model(find_objects(objects), root, include_dirs, a.nm)
    except InputError as e:
        print("floors.py: %s" % e, file=sys.stderr)
        return 2
    res = analyse(model, floors, a.max_file_cycle)
    render(model, floors, res, os.path.relpath(floors_path, root), sys.stdout)
    if res.failed and a.strict:
        return 1
    if res.failed:
        print("(report mode: exit 0; --strict fails on these)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
