"""A PEP 517 build backend for the gpumem package that needs nothing but the
standard library, so that `pip install ./python` works offline (pip has
nothing to download for an empty `requires`) and nothing is compiled.

It builds a plain wheel of gpumem/*.py plus gpumem/_location.py, which
records where this source checkout builds libgpumem.so (../build), so an
installed copy finds the library `make` built; `pip install -e ./python`
gets a wheel holding a .pth file that puts this folder on sys.path.
"""
import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME = "gpumem"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
TAG = "py3-none-any"
DIST_INFO = "%s-%s.dist-info" % (NAME, VERSION)

METADATA = """Metadata-Version: 2.1
Name: {name}
Version: {version}
Summary: Python bindings of gpumem, a caching stream-ordered GPU memory manager
Requires-Python: >=3.8
Classifier: Programming Language :: Python :: 3
Classifier: Operating System :: POSIX :: Linux

See docs/python.md in the gpumem repository.
""".format(name=NAME, version=VERSION)

WHEEL = """Wheel-Version: 1.0
Generator: gpumem_build
Root-Is-Purelib: true
Tag: {tag}
""".format(tag=TAG)


def _location_module():
    build_dir = os.path.normpath(os.path.join(HERE, "..", "build"))
    return ('"""Written at install time: where the source checkout builds libgpumem.so."""\n'
            "BUILD_DIR = %r\n" % build_dir)


def _package_files():
    pkg = os.path.join(HERE, NAME)
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py") and fn != "_location.py":
            with open(os.path.join(pkg, fn), "rb") as f:
                yield "%s/%s" % (NAME, fn), f.read()
    yield "%s/_location.py" % NAME, _location_module().encode()


def _write_wheel(directory, files):
    name = "%s-%s-%s.whl" % (NAME, VERSION, TAG)
    files = list(files) + [("%s/METADATA" % DIST_INFO, METADATA.encode()),
                           ("%s/WHEEL" % DIST_INFO, WHEEL.encode())]
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append("%s/RECORD,," % DIST_INFO)
        z.writestr("%s/RECORD" % DIST_INFO, "\n".join(record) + "\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [("%s_editable.pth" % NAME, (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, VERSION)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ("pyproject.toml", "README.md", "build_backend/gpumem_build.py"):
            t.add(os.path.join(HERE, rel), arcname="%s/%s" % (base, rel))
        for arc, data in _package_files():
            if arc.endswith("_location.py"):
                continue
            info = tarfile.TarInfo("%s/%s" % (base, arc))
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        info.size = len(METADATA.encode())
        t.addfile(info, io.BytesIO(METADATA.encode()))
    return name
