# SPDX-License-Identifier: Apache-2.0
"""gpumem — Python bindings of libgpumem.so (ctypes, standard library only).

This module owns the library handle and the calls every framework adapter
shares: loading libgpumem.so, the per-device pools, stats, trim, the leak
report, raw allocations, and memory-aware batch sizing.  The adapters live in
gpumem.torch (PyTorch's pluggable allocator) and gpumem.cupy (CuPy's
set_allocator); both import their framework only when enabled.

Where the library is looked for, in order (the first that loads wins):
  1. libgpumem.so next to this file (the copy a wheel carries);
  2. $GPUMEM_LIBRARY (a path; if set and unloadable, that is an error);
  3. the build/ folder of the source checkout this package sits in
     (running from the repository, or installed with pip install -e);
  4. the dynamic loader's search path (ctypes.util.find_library("gpumem"),
     LD_LIBRARY_PATH, ldconfig).

Tags, offload and restore (docs/offload.md): `with gpumem.tag("weights"):`
tags what the thread allocates inside (PyTorch tensors included, under
gpumem.torch); gpumem.offload("weights") copies the tag's blocks to pinned
host memory and gives their device pages back; gpumem.restore("weights")
maps pages at the same addresses and copies the data back, so every pointer
and tensor stays valid.  tag_info, acquire and release complete the set.

__version__ is GM_VERSION_STRING of include/gpumem.h: recorded in
_version.py when the wheel is built, read from the header when this package
runs from a checkout.  version() is the loaded library's gm_version().

The pools are the library's per-device pools (gm_device_pool): PyTorch, CuPy,
raw allocations and the figures here all see the same memory.  device=None
means the current device's pool: PyTorch's current device once PyTorch has
initialized CUDA (as torch.cuda.memory_stats() does), else CuPy's when CuPy is
imported, else the default pool (that of $GPUMEM_DEVICE, 0 when unset).

Every public function checks its arguments before it calls the library,
because ctypes converts silently (2**64 + 4096 becomes 4096 as a size_t, -1
becomes SIZE_MAX, 2**32 becomes device 0): sizes, limits, offsets, devices
and streams must be ints (or objects with __index__, like numpy integers;
bool and float are refused) -> TypeError otherwise; sizes and limits lie in
[0, 2**63], devices in [0, 2**31), streams in [0, 2**64), memset values in
[0, 255], and a memset stays inside its allocation -> InvalidArgumentError
(a ValueError and a GpumemError named GM_INVALID_ARGUMENT) otherwise.
"""
import ctypes
import ctypes.util
import gc
import json
import operator
import os
import sys
import threading
import warnings

__all__ = [
    "__version__", "GpumemError", "OutOfMemoryError", "InvalidArgumentError", "library_path", "version", "stats", "trim",
    "set_limit", "leak_report", "alloc", "Allocation", "max_batch_size", "is_out_of_memory",
    "forget_stream", "Tag", "tag", "offload", "restore", "tag_info", "acquire", "release",
    "prepare_offload", "prepare_wait",
    "TAG_DISCARD", "TAG_EVICTABLE",
]

# Status codes of include/gpumem.h (GM_ERRNO_MAP); names come from the library.
GM_OK = 0
GM_INVALID_ARGUMENT = 1
GM_OUT_OF_MEMORY = 2
GM_LIMIT = 3

# Tag flags (GM_TAG_*) and gm_offload's flag (GM_OFFLOAD_DISCARD).
TAG_DISCARD = 0x1
TAG_EVICTABLE = 0x2
_OFFLOAD_DISCARD = 0x1
_TAG_NAME_MAX = 63


class GpumemError(RuntimeError):
    """A gpumem call failed; .status is the GM_* code, .name its name."""

    def __init__(self, message, status=None, name=None):
        super().__init__(message)
        self.status = status
        self.name = name


class OutOfMemoryError(GpumemError, MemoryError):
    """Out of device memory, or over the pool's limit (GM_OUT_OF_MEMORY, GM_LIMIT)."""


class InvalidArgumentError(GpumemError, ValueError):
    """An argument out of range (GM_INVALID_ARGUMENT): found by the package's
    own checks before the library is called, or reported by the library."""

    def __init__(self, message, status=GM_INVALID_ARGUMENT, name="GM_INVALID_ARGUMENT"):
        super().__init__(message, status, name)


# Argument limits (see the module's docstring).  A size above 2**63 is no
# real request; it is refused rather than wrapped by ctypes.
SIZE_MAX = 1 << 63
_DEVICE_END = 1 << 31                                    # C int
_STREAM_END = 1 << (8 * ctypes.sizeof(ctypes.c_void_p))  # a pointer


def _integer(value, what):
    """value as an int: an int or anything with __index__, but not a bool."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__))
    return operator.index(value)


def _size(value, what):
    """A byte count or limit in [0, SIZE_MAX]."""
    n = _integer(value, what)
    if not 0 <= n <= SIZE_MAX:
        raise InvalidArgumentError("%s must be in [0, 2**63], got %d" % (what, n))
    return n


def _device(device):
    """None (the default pool) or a device ordinal that fits a C int; the
    library refuses ordinals it has no pool slot for (GM_INVALID_ARGUMENT)."""
    if device is None:
        return None
    d = _integer(device, "device")
    if not 0 <= d < _DEVICE_END:
        raise InvalidArgumentError("device must be in [0, 2**31), got %d" % d)
    return d


def _stream(stream, what="stream"):
    """A stream handle as an int in [0, 2**64); None means 0, the default stream."""
    if stream is None:
        return 0
    s = _integer(stream, what)
    if not 0 <= s < _STREAM_END:
        raise InvalidArgumentError("%s must be a stream handle in [0, 2**%d), got %d"
                                   % (what, 8 * ctypes.sizeof(ctypes.c_void_p), s))
    return s


_HERE = os.path.dirname(os.path.abspath(__file__))


def _header_version(header):
    """GM_VERSION_STRING of a gpumem.h, None if it has none."""
    try:
        with open(header, encoding="utf-8") as f:
            for line in f:
                words = line.split()
                if words[:2] == ["#define", "GM_VERSION_STRING"] and len(words) == 3:
                    return words[2].strip('"')
    except OSError:
        pass
    return None


try:
    from ._version import __version__  # written by the wheel build
except ImportError:  # a checkout: its header is the one source of the version
    __version__ = _header_version(os.path.join(_HERE, "..", "..", "include", "gpumem.h")) or "0+unknown"

_lock = threading.Lock()
_lib = None
_lib_path = None


def _bundled():
    """The library a wheel carries, next to this file."""
    return os.path.join(_HERE, "libgpumem.so")


def _candidates():
    """(description, path or name) in the order they are tried after the
    bundled library and $GPUMEM_LIBRARY."""
    out = []
    checkout = os.path.normpath(os.path.join(_HERE, "..", "..", "build", "libgpumem.so"))
    out.append(("source checkout build folder", checkout))
    found = ctypes.util.find_library("gpumem")
    if found:
        out.append(("ctypes.util.find_library('gpumem')", found))
    out.append(("dynamic loader search path", "libgpumem.so"))
    # A runtime-only install (a distribution's package) may carry only the
    # SONAME link, libgpumem.so.0, without the development link.
    out.append(("dynamic loader search path", "libgpumem.so.0"))
    return out


def _declare(lib):
    c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    P = ctypes.POINTER
    sigs = {
        "gm_version": (c_char_p, []),
        "gm_strerror": (c_char_p, [c_int]),
        "gm_errname": (c_char_p, [c_int]),
        "gm_last_error": (c_char_p, []),
        "gm_default_pool": (c_int, [P(c_void_p)]),
        "gm_device_pool": (c_int, [c_int, P(c_void_p)]),
        "gm_pool_stats": (c_int, [c_void_p, c_void_p]),
        "gm_stats_json": (c_int, [c_void_p, c_char_p, c_size_t, P(c_size_t)]),
        "gm_trim": (c_int, [c_void_p, c_size_t, P(c_size_t)]),
        "gm_pool_set_limit": (c_int, [c_void_p, c_size_t]),
        "gm_pool_reset_peaks": (c_int, [c_void_p]),
        "gm_alloc": (c_int, [c_void_p, c_size_t, c_void_p, P(c_void_p)]),
        "gm_free": (c_int, [c_void_p, c_void_p, c_void_p]),
        "gm_memset": (c_int, [c_void_p, c_void_p, c_int, c_size_t, c_void_p]),
        "gm_memcpy": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p]),
        "gm_stream_synchronize": (c_int, [c_void_p, c_void_p]),
        "gm_stream_forget": (c_int, [c_void_p, c_void_p]),
        "gm_torch_empty_cache": (None, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    if hasattr(lib, "gm_leak_report"):
        lib.gm_leak_report.restype = c_int
        lib.gm_leak_report.argtypes = [c_void_p, c_char_p, c_size_t, P(c_size_t)]
    # Tags, offload and restore: optional, so that an older library still
    # loads (the functions that need them say what is missing).
    c_uint, c_tag = ctypes.c_uint, ctypes.c_uint32
    optional = {
        "gm_tag_get": (c_int, [c_char_p, c_uint, P(c_tag)]),
        "gm_tag_scope": (c_tag, [c_tag]),
        "gm_offload": (c_int, [c_void_p, c_tag, c_uint, c_void_p]),
        "gm_restore": (c_int, [c_void_p, c_tag, c_void_p]),
        "gm_offload_prepare": (c_int, [c_void_p, c_tag, c_uint]),
        "gm_offload_prepare_wait": (c_int, [c_void_p]),
        "gm_tag_acquire": (c_int, [c_void_p, c_tag, c_void_p]),
        "gm_tag_release": (c_int, [c_void_p, c_tag, c_void_p]),
        "gm_tag_info": (c_int, [c_void_p, c_tag, c_void_p]),
    }
    for name, (res, args) in optional.items():
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args


def _library():
    """(ctypes.CDLL, the path or name it was loaded from); loads it once."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib, _lib_path
        bundled = _bundled()
        if os.path.exists(bundled):
            try:
                lib = ctypes.CDLL(bundled)
                _declare(lib)
            except (OSError, AttributeError) as e:
                raise OSError("gpumem: the library this package carries, %s, cannot be loaded: %s"
                              % (bundled, e)) from e
            _lib, _lib_path = lib, bundled
            return _lib, _lib_path
        env = os.environ.get("GPUMEM_LIBRARY")
        if env:
            try:
                lib = ctypes.CDLL(env)
                _declare(lib)
            except (OSError, AttributeError) as e:
                raise OSError("gpumem: GPUMEM_LIBRARY=%s cannot be loaded as libgpumem.so: %s" % (env, e)) from e
            _lib, _lib_path = lib, env
            return _lib, _lib_path
        tried = []
        for what, path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append("  %s: %s (no such file)" % (what, path))
                continue
            try:
                lib = ctypes.CDLL(path)
                _declare(lib)
            except (OSError, AttributeError) as e:
                tried.append("  %s: %s (%s)" % (what, path, e))
                continue
            _lib, _lib_path = lib, path
            return _lib, _lib_path
        raise OSError("gpumem: libgpumem.so not found. Install the gpumem wheel (it carries the "
                      "library), build it with `make` in the gpumem checkout, or set GPUMEM_LIBRARY "
                      "to its path. Looked in:\n  package folder: %s (no such file)\n" % bundled
                      + "\n".join(tried))


def library_path():
    """The path (or loader name) libgpumem.so was loaded from."""
    return _library()[1]


def version():
    """The library's version string, e.g. "0.1.0"."""
    return _library()[0].gm_version().decode()


def _error(status, what):
    lib = _library()[0]
    name = lib.gm_errname(status).decode()
    detail = lib.gm_last_error().decode()
    msg = "%s: %s (%s)" % (what, detail or lib.gm_strerror(status).decode(), name)
    if status in (GM_OUT_OF_MEMORY, GM_LIMIT):
        cls = OutOfMemoryError
    elif status == GM_INVALID_ARGUMENT:
        cls = InvalidArgumentError
    else:
        cls = GpumemError
    return cls(msg, status, name)


def _check(status, what):
    if status != GM_OK:
        raise _error(status, what)


def _current_device():
    """The device the caller's framework is working on, when one says: PyTorch's
    current device once PyTorch has initialized CUDA (what
    torch.cuda.memory_stats() follows), else CuPy's current device when CuPy is
    imported; None otherwise (the default pool)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return _device(cuda.current_device())
    except (AttributeError, RuntimeError):
        pass
    cupy = sys.modules.get("cupy")
    try:
        if cupy is not None:
            return _device(cupy.cuda.runtime.getDevice())
    except Exception:  # noqa: BLE001 -- CuPy without a usable runtime
        pass
    return None


def _pool(device=None):
    """The pool of `device` (checked by _device first); None: the pool of the
    framework's current device (_current_device), else the default pool."""
    device = _device(device)
    if device is None:
        device = _current_device()
    lib = _library()[0]
    p = ctypes.c_void_p()
    if device is None:
        _check(lib.gm_default_pool(ctypes.byref(p)), "gm_default_pool")
    else:
        _check(lib.gm_device_pool(device, ctypes.byref(p)), "gm_device_pool(%d)" % device)
    return p


# gm_stats_t is versioned by its size: pass a buffer larger than any version
# and let the library fill what it has; only the library reads it (JSON).
_STATS_BUF = 8192


def stats(device=None):
    """The pool's statistics as a dict (the fields of GM_STAT_FIELDS, plus
    backend_calls): allocated, allocated_peak, reserved, reserved_peak, ..."""
    lib = _library()[0]
    pool = _pool(device)
    buf = ctypes.create_string_buffer(_STATS_BUF)
    ctypes.c_size_t.from_buffer(buf, 0).value = _STATS_BUF
    ctypes.c_uint.from_buffer(buf, ctypes.sizeof(ctypes.c_size_t)).value = 1
    _check(lib.gm_pool_stats(pool, buf), "gm_pool_stats")
    need = ctypes.c_size_t()
    lib.gm_stats_json(buf, None, 0, ctypes.byref(need))
    out = ctypes.create_string_buffer(need.value + 1)
    _check(lib.gm_stats_json(buf, out, need.value + 1, None), "gm_stats_json")
    return json.loads(out.value.decode())


def reset_peaks(device=None):
    """Reset the *_peak statistics to the current values."""
    lib = _library()[0]
    _check(lib.gm_pool_reset_peaks(_pool(device)), "gm_pool_reset_peaks")


def trim(keep=0, device=None):
    """Give cached memory back to the device until at most `keep` bytes of
    cached memory remain; returns the bytes given back."""
    keep = _size(keep, "trim: keep")
    lib = _library()[0]
    released = ctypes.c_size_t()
    _check(lib.gm_trim(_pool(device), keep, ctypes.byref(released)), "gm_trim")
    return released.value


def _trim_all():
    """gm_trim(0) on every pool the library has created (errors to stderr)."""
    _library()[0].gm_torch_empty_cache()


def forget_stream(stream, device=None):
    """Call before destroying a stream that memory was freed on (a CUDA stream
    handle as an int, e.g. cupy.cuda.Stream.ptr or torch.cuda.Stream.cuda_stream):
    waits for it if the pool holds blocks freed on it and makes them usable
    by every stream, so the pool never records an event on it again."""
    if stream is None:
        raise TypeError("forget_stream: stream must be an int (a stream handle), not None")
    stream = _stream(stream, "forget_stream: stream")
    lib = _library()[0]
    _check(lib.gm_stream_forget(_pool(device), ctypes.c_void_p(stream)), "gm_stream_forget")


def set_limit(limit, device=None):
    """Set the pool's hard limit on reserved bytes (0: the device's memory)."""
    limit = _size(limit, "set_limit: limit")
    lib = _library()[0]
    _check(lib.gm_pool_set_limit(_pool(device), limit), "gm_pool_set_limit")


def leak_report(device=None):
    """The library's report of live allocations (gm_leak_report): of every
    pool when device is None, else of that device's pool."""
    lib = _library()[0]
    if not hasattr(lib, "gm_leak_report"):
        raise GpumemError("gpumem: %s has no gm_leak_report (built before leak reports existed)"
                          % library_path())
    pool = None if device is None else _pool(device)
    need = ctypes.c_size_t(0)
    rc = lib.gm_leak_report(pool, None, 0, ctypes.byref(need))  # cap 0: the length it needs
    if rc != GM_OK and need.value == 0:
        _check(rc, "gm_leak_report")
    cap = need.value + 4096
    for _ in range(4):  # the report may grow between two calls
        buf = ctypes.create_string_buffer(cap)
        rc = lib.gm_leak_report(pool, buf, cap, ctypes.byref(need))
        if rc == GM_OK and need.value < cap:
            return buf.value.decode(errors="replace")
        if need.value < cap:
            _check(rc, "gm_leak_report")
        cap = need.value + 4096
    raise GpumemError("gm_leak_report: the report kept growing (%d bytes)" % need.value)


# ---- tags, offload and restore --------------------------------------------------


class _TagInfo(ctypes.Structure):
    """gm_tag_info_t (GM_TAG_INFO_VERSION 1)."""
    _fields_ = [
        ("size", ctypes.c_size_t), ("version", ctypes.c_uint),
        ("name", ctypes.c_char * (_TAG_NAME_MAX + 1)), ("flags", ctypes.c_uint),
        ("resident_blocks", ctypes.c_uint64), ("resident_bytes", ctypes.c_uint64),
        ("offloaded_blocks", ctypes.c_uint64), ("offloaded_bytes", ctypes.c_uint64),
        ("holds", ctypes.c_uint64), ("offloads", ctypes.c_uint64), ("restores", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
    ]


_TAG_INFO_VERSION = 1
_tags = {}                     # name -> Tag made or found by this process
_tags_lock = threading.Lock()
_scope = threading.local()     # .stack: the tags a `with` replaced, per thread


def _tag_lib(what):
    """The library, which must have the tag functions."""
    lib = _library()[0]
    if not hasattr(lib, "gm_offload"):
        raise GpumemError("%s: %s has no tags, offload or restore (built before they existed)"
                          % (what, library_path()))
    return lib


class Tag:
    """A tag: a process-wide name for a set of allocations that are offloaded
    and restored together (gm_tag_get).  .id (the library's number), .name,
    .flags (TAG_DISCARD, TAG_EVICTABLE).  Made by gpumem.tag(); as a context
    manager it is the thread's current tag (gm_tag_scope) inside the block,
    and the tag that was current before comes back on exit."""

    __slots__ = ("_id", "_name", "_flags")

    def __init__(self, tag_id, name, flags):
        self._id, self._name, self._flags = tag_id, name, flags

    id = property(lambda self: self._id, doc="the library's tag number (gm_tag_t)")
    name = property(lambda self: self._name, doc="the tag's name")
    flags = property(lambda self: self._flags, doc="TAG_DISCARD | TAG_EVICTABLE")
    discard = property(lambda self: bool(self._flags & TAG_DISCARD))
    evictable = property(lambda self: bool(self._flags & TAG_EVICTABLE))

    def __enter__(self):
        lib = _tag_lib("gpumem.tag")
        stack = getattr(_scope, "stack", None)
        if stack is None:
            stack = _scope.stack = []
        stack.append(lib.gm_tag_scope(self._id))
        return self

    def __exit__(self, *exc):
        stack = getattr(_scope, "stack", None)
        if stack:  # `with` exits in the reverse order of entries, per thread
            _library()[0].gm_tag_scope(stack.pop())

    def __eq__(self, other):
        return isinstance(other, Tag) and other._id == self._id

    def __hash__(self):
        return hash(("gpumem.Tag", self._id))

    def __repr__(self):
        words = [w for w, bit in (("discard", TAG_DISCARD), ("evictable", TAG_EVICTABLE))
                 if self._flags & bit]
        return "gpumem.Tag(%r, id=%d%s)" % (self._name, self._id,
                                            ", " + "|".join(words) if words else "")

    def offload(self, discard=False, device=None, stream=None):
        """gpumem.offload(self, ...)."""
        offload(self, discard=discard, device=device, stream=stream)

    def prepare_offload(self, background=True, device=None):
        """gpumem.prepare_offload(self, ...)."""
        prepare_offload(self, background=background, device=device)

    def restore(self, device=None, stream=None):
        """gpumem.restore(self, ...)."""
        restore(self, device=device, stream=stream)

    def info(self, device=None):
        """gpumem.tag_info(self, ...)."""
        return tag_info(self, device=device)


def _tag_name(name):
    """A tag name as bytes: a str (or bytes) of 1 to 63 bytes in UTF-8, no NUL."""
    if isinstance(name, str):
        raw = name.encode("utf-8")
    elif isinstance(name, bytes):
        raw = name
    else:
        raise TypeError("a tag name must be a str, not %s" % type(name).__name__)
    if not 1 <= len(raw) <= _TAG_NAME_MAX or b"\0" in raw:
        raise InvalidArgumentError("a tag name is 1 to %d bytes without NUL, got %r"
                                   % (_TAG_NAME_MAX, name))
    return raw


def _flag(value, what):
    if value is not None and not isinstance(value, bool):
        raise TypeError("tag: %s must be True, False or None, not %s" % (what, type(value).__name__))
    return value


def tag(name, discard=None, evictable=None):
    """The tag called `name` (made on first use; gm_tag_get), as a Tag.

    discard=True: its contents need not survive an offload (the pages are
    released without a copy, restore maps fresh ones: a KV cache that is
    rebuilt anyway).  evictable=True: a pool made with GPUMEM_EVICT=1 may
    offload it by itself when an allocation would otherwise fail, while no
    acquire() holds it.  Flags are fixed when the tag is made: None (the
    default) takes the tag as it is, or makes it with that flag off; True or
    False must match an existing tag (InvalidArgumentError otherwise).

        with gpumem.tag("weights"):
            model = build().cuda()      # every allocation of this thread is tagged
        gpumem.offload("weights")       # device memory back to the driver
        gpumem.restore("weights")       # same addresses, same data

    A Tag may be given instead of a name (returned as it is)."""
    discard, evictable = _flag(discard, "discard"), _flag(evictable, "evictable")
    if isinstance(name, Tag):
        for want, bit, what in ((discard, TAG_DISCARD, "discard"), (evictable, TAG_EVICTABLE, "evictable")):
            if want is not None and want != bool(name.flags & bit):
                raise InvalidArgumentError("tag %r was made with %s=%s" % (name.name, what, not want))
        return name
    raw = _tag_name(name)
    key = raw.decode("utf-8", errors="surrogateescape")
    lib = _tag_lib("gpumem.tag")
    with _tags_lock:
        known = _tags.get(key)
        if known is not None:
            return tag(known, discard=discard, evictable=evictable)
        # The flags to ask with: those given, the others off; with None for a
        # flag, an existing tag may have it either way: the other value is
        # tried when the library refuses the first.
        tries = [0]
        for want, bit in ((discard, TAG_DISCARD), (evictable, TAG_EVICTABLE)):
            if want:
                tries = [f | bit for f in tries]
            elif want is None:
                tries = tries + [f | bit for f in tries]
        t = ctypes.c_uint32()
        status = GM_OK
        for flags in tries:
            status = lib.gm_tag_get(raw, flags, ctypes.byref(t))
            if status == GM_OK:
                found = Tag(t.value, key, flags)
                _tags[key] = found
                return found
            if status != GM_INVALID_ARGUMENT:
                break
        if status == GM_INVALID_ARGUMENT and len(tries) > 1:
            # the library's message for the flags asked first, not the last probe's
            status = lib.gm_tag_get(raw, tries[0], ctypes.byref(t)) or GM_INVALID_ARGUMENT
        raise _error(status, "gm_tag_get(%r)" % key)


def _tag_id(t, what):
    """The gm_tag_t of a Tag or a tag name (made with tag(name) when new)."""
    if isinstance(t, Tag):
        return t.id
    if isinstance(t, (str, bytes)):
        return tag(t).id
    raise TypeError("%s: a tag must be a gpumem.Tag or a tag name (str), not %s"
                    % (what, type(t).__name__))


def _default_stream(stream, device, what):
    """stream as a handle; None: PyTorch's current stream of the device when
    PyTorch is imported and has initialized CUDA, else 0 (the default stream)."""
    if stream is not None:
        return _stream(stream, what + ": stream")
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            s = cuda.current_stream(device) if device is not None else cuda.current_stream()
            return _stream(s.cuda_stream, what + ": torch's current stream")
    except (AttributeError, RuntimeError):
        pass
    return 0


def offload(tag, discard=False, device=None, stream=None):
    """Put the tag's blocks of the device's pool to sleep (gm_offload): wait
    for `stream` and the blocks' streams, copy the blocks to pinned host
    memory (none with discard=True or a TAG_DISCARD tag) and give their
    device pages back.  The blocks stay allocated at the same addresses but
    must not be touched on the device until restore().  tag: a Tag or a name.
    stream None: PyTorch's current stream when PyTorch has initialized CUDA,
    else the default stream.  Raises GpumemError (e.g. GM_NO_HOST_MEMORY;
    what was done is in the message, nothing is lost: call it again)."""
    if not isinstance(discard, bool):
        raise TypeError("offload: discard must be True or False, not %s" % type(discard).__name__)
    tid = _tag_id(tag, "offload")
    device = _device(device)
    s = _default_stream(stream, device, "offload")
    lib = _tag_lib("offload")
    _check(lib.gm_offload(_pool(device), tid, _OFFLOAD_DISCARD if discard else 0, ctypes.c_void_p(s)),
           "gm_offload(%s)" % _tag_label(tag))


def _prepare_lib(what):
    lib = _tag_lib(what)
    if not hasattr(lib, "gm_offload_prepare"):
        raise GpumemError("%s: %s has no gm_offload_prepare (built before it existed)"
                          % (what, library_path()))
    return lib


def prepare_offload(tag, background=True, device=None):
    """Pin the host memory of the tag's next offload ahead of time
    (gm_offload_prepare), so that a first sleep runs at the speed of later
    ones.  Sized from the tag's resident blocks now; the memory stays pinned
    in the pool's host pool until gm_host_trim (host_reserved in stats()).
    background=True (GM_PREPARE_ASYNC) returns at once; the next offload
    waits for it, prepare_wait() gives its status.  A TAG_DISCARD tag needs
    nothing.  Raises GpumemError when pinned memory cannot be made (what was
    made stays)."""
    if not isinstance(background, bool):
        raise TypeError("prepare_offload: background must be True or False, not %s"
                        % type(background).__name__)
    tid = _tag_id(tag, "prepare_offload")
    device = _device(device)
    lib = _prepare_lib("prepare_offload")
    _check(lib.gm_offload_prepare(_pool(device), tid, 1 if background else 0),
           "gm_offload_prepare(%s)" % _tag_label(tag))


def prepare_wait(device=None):
    """Wait for the device pool's background prepare_offload() and raise its
    error, if it had one (gm_offload_prepare_wait)."""
    device = _device(device)
    lib = _prepare_lib("prepare_wait")
    _check(lib.gm_offload_prepare_wait(_pool(device)), "gm_offload_prepare_wait")


def restore(tag, device=None, stream=None):
    """Wake the tag's offloaded blocks (gm_restore): pages mapped at the
    blocks' own addresses and the data copied back; work queued on `stream`
    afterwards sees it.  All or nothing: OutOfMemoryError when the pages
    cannot be had, and the tag stays offloaded (try again later).  stream as
    for offload()."""
    tid = _tag_id(tag, "restore")
    device = _device(device)
    s = _default_stream(stream, device, "restore")
    lib = _tag_lib("restore")
    _check(lib.gm_restore(_pool(device), tid, ctypes.c_void_p(s)), "gm_restore(%s)" % _tag_label(tag))


def acquire(tag, device=None, stream=None):
    """Hold an evictable tag (gm_tag_acquire): restore it if it was evicted
    or offloaded, and keep the pool from evicting it until release()."""
    tid = _tag_id(tag, "acquire")
    device = _device(device)
    s = _default_stream(stream, device, "acquire")
    lib = _tag_lib("acquire")
    _check(lib.gm_tag_acquire(_pool(device), tid, ctypes.c_void_p(s)),
           "gm_tag_acquire(%s)" % _tag_label(tag))


def release(tag, device=None, stream=None):
    """Drop one hold of acquire() (gm_tag_release); the tag's work queued on
    `stream` before it is waited for before any eviction.  Without a hold:
    GpumemError GM_INVALID_STATE."""
    tid = _tag_id(tag, "release")
    device = _device(device)
    s = _default_stream(stream, device, "release")
    lib = _tag_lib("release")
    _check(lib.gm_tag_release(_pool(device), tid, ctypes.c_void_p(s)),
           "gm_tag_release(%s)" % _tag_label(tag))


def tag_info(tag, device=None):
    """The tag's figures in the device's pool (gm_tag_info) as a dict: name,
    id, flags, discard, evictable, resident_blocks, resident_bytes,
    offloaded_blocks, offloaded_bytes, holds, offloads, restores, evictions."""
    tid = _tag_id(tag, "tag_info")
    lib = _tag_lib("tag_info")
    info = _TagInfo()
    info.size = ctypes.sizeof(_TagInfo)
    info.version = _TAG_INFO_VERSION
    _check(lib.gm_tag_info(_pool(device), tid, ctypes.byref(info)), "gm_tag_info(%s)" % _tag_label(tag))
    out = {"name": info.name.decode("utf-8", errors="replace"), "id": tid, "flags": info.flags,
           "discard": bool(info.flags & TAG_DISCARD), "evictable": bool(info.flags & TAG_EVICTABLE)}
    for field in ("resident_blocks", "resident_bytes", "offloaded_blocks", "offloaded_bytes", "holds",
                  "offloads", "restores", "evictions"):
        out[field] = getattr(info, field)
    return out


def _tag_label(t):
    return repr(t.name) if isinstance(t, Tag) else repr(t)


class Allocation:
    """Device memory from gpumem: .ptr (int; 0 for a 0-byte allocation),
    .size, .device, .stream, all read-only.  Freed by free(), by leaving a
    `with` block, or when collected; .ptr is None once freed."""

    __slots__ = ("_ptr", "_size", "_device", "_stream", "_pool", "__weakref__")

    def __init__(self, size, stream=0, device=None):
        if getattr(self, "_ptr", None) is not None:  # a second __init__ would lose the block
            raise TypeError("Allocation is already initialized")
        self._ptr = None
        size = _size(size, "alloc: size")
        stream = _stream(stream, "alloc: stream")
        self._pool = _pool(device)
        device = _device(device)
        self._size, self._device, self._stream = size, (_current_device() if device is None else device), stream
        lib = _library()[0]
        p = ctypes.c_void_p()
        _check(lib.gm_alloc(self._pool, size, ctypes.c_void_p(stream), ctypes.byref(p)),
               "gm_alloc(%d bytes)" % size)
        self._ptr = p.value or 0

    ptr = property(lambda self: self._ptr, doc="device address (int), None once freed")
    size = property(lambda self: self._size, doc="bytes requested")
    device = property(lambda self: self._device,
                      doc="device ordinal; None: the default pool (no framework named a current device)")
    stream = property(lambda self: self._stream, doc="stream it was allocated and is freed on")

    def memset(self, value, size=None, offset=0):
        """Set `size` bytes from `offset` to the byte `value` (0..255), on the
        allocation's stream; size None: to the end.  The range must lie
        inside the allocation (InvalidArgumentError otherwise)."""
        if self._ptr is None:
            raise ValueError("memset on a freed allocation")
        value = _integer(value, "memset: value")
        if not 0 <= value <= 255:
            raise InvalidArgumentError("memset: value must be a byte in [0, 255], got %d" % value)
        offset = _size(offset, "memset: offset")
        if offset > self._size:
            raise InvalidArgumentError("memset: offset %d is past the end of the %d-byte allocation"
                                       % (offset, self._size))
        n = self._size - offset if size is None else _size(size, "memset: size")
        if n > self._size - offset:
            raise InvalidArgumentError("memset: %d bytes at offset %d run past the end of the "
                                       "%d-byte allocation" % (n, offset, self._size))
        if n == 0:
            return
        lib = _library()[0]
        _check(lib.gm_memset(self._pool, ctypes.c_void_p(self._ptr + offset), value, n,
                             ctypes.c_void_p(self._stream)), "gm_memset")

    def free(self):
        """Free the memory (a second call does nothing)."""
        ptr, self._ptr = self._ptr, None
        if ptr:
            lib = _library()[0]
            _check(lib.gm_free(self._pool, ctypes.c_void_p(ptr), ctypes.c_void_p(self._stream)), "gm_free")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    # One owner per block: a copy would free it a second time, possibly after
    # the pool handed it to someone else.
    def __copy__(self):
        raise TypeError("an Allocation owns its device memory and cannot be copied")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce__(self):
        raise TypeError("an Allocation owns its device memory and cannot be pickled")

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def alloc(size, stream=0, device=None):
    """Allocate `size` bytes of device memory usable on `stream` (a
    cudaStream_t as an int; 0 = the default stream).  Raises
    gpumem.OutOfMemoryError when it does not fit."""
    return Allocation(size, stream, device)


def is_out_of_memory(exc):
    """Whether exc is an out-of-memory error of gpumem, PyTorch or CuPy."""
    if isinstance(exc, OutOfMemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            if isinstance(exc, cupy.cuda.memory.OutOfMemoryError):
                return True
        except AttributeError:
            pass
    # gm_torch_alloc's failure reaches Python as a RuntimeError (see
    # gpumem.torch); PyTorch's own allocator uses the same first words.
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def _release_all():
    gc.collect()
    from . import torch as _gtorch
    if _gtorch.is_enabled():
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    _trim_all()


def max_batch_size(step, lo, hi, device=None):
    """The largest batch b in [lo, hi] for which step(b) runs without running
    out of device memory (memory-aware batch sizing).

    step(b) is called with candidate sizes; an out-of-memory error from
    gpumem, PyTorch or CuPy (see is_out_of_memory) means "does not fit", any
    other exception propagates.  Between probes every reference the probe
    made is dropped, the garbage collector runs, PyTorch's cache is emptied
    (when gpumem.torch is enabled) and every gpumem pool is trimmed, so the
    probes leave neither fragmentation nor held memory behind.  Binary
    search: step runs at most 2 + ceil(log2(hi - lo)) times.  Raises
    gpumem.OutOfMemoryError if even step(lo) does not fit; warns if the
    pool holds more reserved memory at the end than at the start (memory
    kept alive by something step created).
    """
    if not callable(step):
        raise TypeError("max_batch_size: step must be callable, not %s" % type(step).__name__)
    lo, hi = _integer(lo, "max_batch_size: lo"), _integer(hi, "max_batch_size: hi")
    device = _device(device)
    if lo < 1 or hi < lo:
        raise InvalidArgumentError("max_batch_size: need 1 <= lo <= hi, got lo=%d hi=%d" % (lo, hi))
    _release_all()
    before = stats(device)["reserved"]

    def fits(b):
        ok = True
        try:
            step(b)
        except BaseException as e:  # noqa: B902 — only OOM is swallowed
            if not is_out_of_memory(e):
                raise
            ok = False
            e.__traceback__ = None  # its frames may hold the probe's tensors
        _release_all()
        return ok

    if not fits(lo):
        raise OutOfMemoryError("max_batch_size: even step(%d) runs out of device memory" % lo,
                               GM_OUT_OF_MEMORY, "GM_OUT_OF_MEMORY")
    if fits(hi):
        best = hi
    else:
        good, bad = lo, hi  # step(good) fits, step(bad) does not
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
        best = good
    after = stats(device)["reserved"]
    if after > before:
        warnings.warn("gpumem.max_batch_size: the pool holds %d reserved bytes after probing, %d "
                      "before: something step() created is still alive" % (after, before),
                      ResourceWarning, stacklevel=2)
    return best


# The adapters (their frameworks are imported only when enabled) and sharing;
# none loads the library or touches a device at import.
from . import cupy, share, torch  # noqa: E402,F401
