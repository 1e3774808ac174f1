# SPDX-License-Identifier: Apache-2.0
"""A PEP 517 build backend for the gpumem package that needs nothing but the
standard library (pip has nothing to download for an empty `requires`, so
`pip install ./python` works offline), and whose wheel CARRIES libgpumem.so,
built here from the C sources: the installed package depends on no checkout.

Where the C sources are: ../ when this is python/ of a gpumem checkout, or
native/ in an sdist (build_sdist copies include/, src/ and gpumem.map there).
How the library is built, in a scratch folder that is removed afterwards:
  * cmake, when it is installed and the sources are a checkout (its
    CMakeLists.txt): the library target of the project's own build, as `make`
    builds it;
  * else the C compiler ($CC, cc, gcc or clang) on src/*.c src/*/*.c
    with the flags of the CMake build;
  * neither: an error saying what to install.
GPUMEM_WHEEL_BUILDER=cmake|cc forces one; GPUMEM_WHEEL_CMAKE_ARGS adds cmake
arguments (e.g. -DGM_LTO=OFF); GPUMEM_WHEEL_JOBS sets the parallel jobs.

The version is GM_VERSION_STRING of include/gpumem.h, the project's one
version number (pyproject.toml declares it dynamic); the wheel records it in
gpumem/_version.py.  The wheel is tagged py3-none-<platform of the running
interpreter> (sysconfig): it holds a native library but no extension module,
so any Python 3 of that platform can load it with ctypes.
`pip install -e ./python` gets a wheel holding a .pth file that puts python/
on sys.path; that copy uses the checkout's build/ (see gpumem/__init__.py).
"""
import base64
import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

NAME = "gpumem"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/ (or the sdist root)
SDIST_NATIVE = os.path.join(HERE, "native")
# What of the repository the library is built from (also what an sdist carries).
NATIVE_PARTS = ("include", "src", "gpumem.map")


class BuildError(RuntimeError):
    """The library cannot be built here (says what is missing)."""


# ---- sources and version -----------------------------------------------------

def source_root():
    """The folder holding include/, src/ and gpumem.map: native/ of an sdist,
    else the checkout python/ sits in."""
    for root in (SDIST_NATIVE, os.path.dirname(HERE)):
        if os.path.isfile(os.path.join(root, "include", "gpumem.h")):
            return root
    raise BuildError("gpumem_build: the C sources are not here: neither %s nor %s holds "
                     "include/gpumem.h (build from a gpumem checkout or its sdist)"
                     % (SDIST_NATIVE, os.path.dirname(HERE)))


def read_version(header=None):
    """GM_VERSION_STRING of include/gpumem.h."""
    header = header or os.path.join(source_root(), "include", "gpumem.h")
    with open(header, encoding="utf-8") as f:
        m = re.search(r'^#define\s+GM_VERSION_STRING\s+"([^"]+)"', f.read(), re.M)
    if not m:
        raise BuildError("gpumem_build: %s defines no GM_VERSION_STRING" % header)
    return m.group(1)


def platform_tag():
    """The wheel platform tag of the running interpreter, e.g. linux_x86_64."""
    return re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


# ---- building libgpumem.so ---------------------------------------------------

def _jobs():
    try:
        return max(1, int(os.environ.get("GPUMEM_WHEEL_JOBS") or os.cpu_count() or 1))
    except ValueError:
        raise BuildError("gpumem_build: GPUMEM_WHEEL_JOBS=%r is not a number"
                         % os.environ["GPUMEM_WHEEL_JOBS"]) from None


def _run(cmd, cwd=None):
    print("gpumem_build: " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        subprocess.run(cmd, cwd=cwd, check=True, stdout=sys.stderr)
    except FileNotFoundError as e:
        raise BuildError("gpumem_build: cannot run %s: %s" % (cmd[0], e)) from e
    except subprocess.CalledProcessError as e:
        raise BuildError("gpumem_build: `%s` failed (exit %d); its output is above"
                         % (" ".join(cmd), e.returncode)) from e


def _compiler():
    """The C compiler as a command list: $CC (which must exist when set), else
    the first of cc, gcc, clang on PATH; None when there is none."""
    if os.environ.get("CC"):
        words = os.environ["CC"].split()
        if not shutil.which(words[0]):
            raise BuildError("gpumem_build: CC=%s: no such compiler" % os.environ["CC"])
        return words
    for cc in ("cc", "gcc", "clang"):
        path = shutil.which(cc)
        if path:
            return [path]
    return None


def _build_with_cmake(root, work):
    build = os.path.join(work, "build")
    extra = os.environ.get("GPUMEM_WHEEL_CMAKE_ARGS", "").split()
    _run(["cmake", "-S", root, "-B", build, "--log-level=WARNING", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
          "-DGM_DEBUG_LEVEL=1", "-DGM_SANITIZE=", "-DGM_FUZZ=OFF"] + extra)
    _run(["cmake", "--build", build, "--target", "gpumem_shared", "-j", str(_jobs())])
    return os.path.join(build, "libgpumem.so")


def _compiles(cc, work, source, flags):
    test = os.path.join(work, "probe.c")
    with open(test, "w") as f:
        f.write(source)
    r = subprocess.run(cc + [test, "-o", os.path.join(work, "probe")] + flags,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def _build_with_cc(root, work, cc):
    """The CMake build's library rule by hand: same flags, -fexceptions for
    torch.c, the version script, zlib when it links."""
    flags = ["-std=c11", "-O2", "-g", "-fPIC", "-pthread", "-Wall", "-Wextra", "-fvisibility=hidden",
             "-D_GNU_SOURCE", "-DGM_DEBUG=1", "-I" + os.path.join(root, "include"),
             "-I" + os.path.join(root, "src")]
    libs = ["-pthread", "-ldl"]
    if _compiles(cc, work, "#include <zlib.h>\nint main(void) { return zlibVersion() == 0; }\n", ["-lz"]):
        flags.append("-DGM_HAVE_ZLIB=1")
        libs.append("-lz")
    sources = sorted(glob.glob(os.path.join(root, "src", "*.c")) +
                     glob.glob(os.path.join(root, "src", "*", "*.c")))
    if not sources:
        raise BuildError("gpumem_build: no C sources in %s/src" % root)
    objects = []
    for i, src in enumerate(sources):
        obj = os.path.join(work, "%02d_%s.o" % (i, os.path.basename(src)[:-2]))
        extra = ["-fexceptions"] if os.path.basename(src) == "torch.c" else []
        _run(cc + flags + extra + ["-c", src, "-o", obj])
        objects.append(obj)
    out = os.path.join(work, "libgpumem.so")
    _run(cc + ["-shared", "-o", out] + objects +
         ["-Wl,--version-script=" + os.path.join(root, "gpumem.map")] + libs)
    return out


def build_library(work):
    """Build libgpumem.so under `work`; returns its path."""
    root = source_root()
    forced = os.environ.get("GPUMEM_WHEEL_BUILDER", "")
    if forced not in ("", "cmake", "cc"):
        raise BuildError("gpumem_build: GPUMEM_WHEEL_BUILDER=%r: use cmake or cc" % forced)
    has_cmakelists = os.path.isfile(os.path.join(root, "CMakeLists.txt"))
    cmake = shutil.which("cmake")
    if forced == "cmake" or (not forced and cmake and has_cmakelists):
        if not cmake:
            raise BuildError("gpumem_build: GPUMEM_WHEEL_BUILDER=cmake but cmake is not installed")
        if not has_cmakelists:
            raise BuildError("gpumem_build: GPUMEM_WHEEL_BUILDER=cmake but %s has no CMakeLists.txt "
                             "(an sdist builds with the C compiler)" % root)
        return _build_with_cmake(root, work)
    cc = _compiler()
    if not cc:
        raise BuildError("gpumem_build: building libgpumem.so needs a C compiler (cc, gcc or clang, "
                         "or set CC) and preferably cmake; none is installed. On Debian/Ubuntu: "
                         "apt-get install gcc cmake")
    return _build_with_cc(root, work, cc)


# ---- wheel -------------------------------------------------------------------

def _metadata(version):
    return """Metadata-Version: 2.1
Name: {name}
Version: {version}
Summary: Python bindings of gpumem, a caching stream-ordered GPU memory manager
Requires-Python: >=3.8
Classifier: Programming Language :: Python :: 3
Classifier: Operating System :: POSIX :: Linux

See docs/python.md in the gpumem repository.
""".format(name=NAME, version=version)


def _wheel_file(tag, purelib):
    return ("Wheel-Version: 1.0\nGenerator: gpumem_build\nRoot-Is-Purelib: %s\nTag: %s\n"
            % ("true" if purelib else "false", tag))


def _package_files(version):
    pkg = os.path.join(HERE, NAME)
    for fn in sorted(os.listdir(pkg)):
        if (fn.endswith(".py") or fn.endswith(".cpp")) and fn != "_version.py":
            with open(os.path.join(pkg, fn), "rb") as f:
                yield "%s/%s" % (NAME, fn), f.read()
    # gpumem.torch compiles torch_allocator.cpp against this header.
    with open(os.path.join(source_root(), "include", "gpumem.h"), "rb") as f:
        yield "%s/include/gpumem.h" % NAME, f.read()
    yield "%s/_version.py" % NAME, ('"""Written by the build backend from GM_VERSION_STRING of '
                                    'include/gpumem.h."""\n__version__ = %r\n' % version).encode()


def _write_wheel(directory, files, version, tag, purelib):
    dist_info = "%s-%s.dist-info" % (NAME, version)
    name = "%s-%s-%s.whl" % (NAME, version, tag)
    files = list(files) + [("%s/METADATA" % dist_info, _metadata(version).encode()),
                           ("%s/WHEEL" % dist_info, _wheel_file(tag, purelib).encode())]
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append("%s/RECORD,," % dist_info)
        z.writestr("%s/RECORD" % dist_info, "\n".join(record) + "\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = read_version()
    work = tempfile.mkdtemp(prefix="gpumem-wheel-")
    try:
        with open(build_library(work), "rb") as f:
            lib = f.read()
        files = list(_package_files(version)) + [("%s/libgpumem.so" % NAME, lib)]
        return _write_wheel(wheel_directory, files, version, "py3-none-" + platform_tag(), False)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [("%s_editable.pth" % NAME, (HERE + "\n").encode())],
                        read_version(), "py3-none-any", True)


def build_sdist(sdist_directory, config_settings=None):
    version = read_version()
    root = source_root()
    base = "%s-%s" % (NAME, version)
    name = base + ".tar.gz"
    metadata = _metadata(version).encode()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ("pyproject.toml", "README.md", "build_backend/gpumem_build.py"):
            t.add(os.path.join(HERE, rel), arcname="%s/%s" % (base, rel))
        for arc, data in _package_files(version):
            if arc.endswith("_version.py"):
                continue
            info = tarfile.TarInfo("%s/%s" % (base, arc))
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for part in NATIVE_PARTS:
            t.add(os.path.join(root, part), arcname="%s/native/%s" % (base, part),
                  filter=lambda ti: None if ti.name.endswith((".o", ".so", ".pyc")) else ti)
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        info.size = len(metadata)
        t.addfile(info, io.BytesIO(metadata))
    return name
