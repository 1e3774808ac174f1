"""gpumem — Python bindings of libgpumem.so (ctypes, standard library only).

This module owns the library handle and the calls every framework adapter
shares: loading libgpumem.so, the per-device pools, stats, trim, the leak
report, raw allocations, and memory-aware batch sizing.  The adapters live in
gpumem.torch (PyTorch's pluggable allocator) and gpumem.cupy (CuPy's
set_allocator); both import their framework only when enabled.

Where the library is looked for, in order (the first that loads wins):
  1. $GPUMEM_LIBRARY (a path; if set and unloadable, that is an error);
  2. the build/ folder of the source checkout this package sits in
     (running from the repository, or installed with pip install -e);
  3. the build/ folder recorded when the package was installed from a
     checkout (pip install ./python);
  4. libgpumem.so next to this file;
  5. the dynamic loader's search path (ctypes.util.find_library("gpumem"),
     LD_LIBRARY_PATH, ldconfig).

The pools are the library's per-device pools (gm_device_pool): PyTorch, CuPy,
raw allocations and the figures here all see the same memory.  device=None
means the default pool (that of $GPUMEM_DEVICE, 0 when unset).
"""
import ctypes
import ctypes.util
import gc
import json
import os
import sys
import threading
import warnings

__all__ = [
    "GpumemError", "OutOfMemoryError", "library_path", "version", "stats", "trim",
    "set_limit", "leak_report", "alloc", "Allocation", "max_batch_size", "is_out_of_memory",
    "forget_stream",
]

# Status codes of include/gpumem.h (GM_ERRNO_MAP); names come from the library.
GM_OK = 0
GM_OUT_OF_MEMORY = 2
GM_LIMIT = 3


class GpumemError(RuntimeError):
    """A gpumem call failed; .status is the GM_* code, .name its name."""

    def __init__(self, message, status=None, name=None):
        super().__init__(message)
        self.status = status
        self.name = name


class OutOfMemoryError(GpumemError, MemoryError):
    """Out of device memory, or over the pool's limit (GM_OUT_OF_MEMORY, GM_LIMIT)."""


_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    """(description, path or name) in the order they are tried."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    checkout = os.path.normpath(os.path.join(here, "..", "..", "build", "libgpumem.so"))
    out.append(("source checkout build folder", checkout))
    try:
        from . import _location  # written by setup.py at install time
        out.append(("build folder recorded at install", os.path.join(_location.BUILD_DIR, "libgpumem.so")))
    except ImportError:
        pass
    out.append(("package folder", os.path.join(here, "libgpumem.so")))
    found = ctypes.util.find_library("gpumem")
    if found:
        out.append(("ctypes.util.find_library('gpumem')", found))
    out.append(("dynamic loader search path", "libgpumem.so"))
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


def _library():
    """(ctypes.CDLL, the path or name it was loaded from); loads it once."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib, _lib_path
    with _lock:
        if _lib is not None:
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
        raise OSError("gpumem: libgpumem.so not found. Build it with `make` in the gpumem checkout, "
                      "or set GPUMEM_LIBRARY to its path. Looked in:\n" + "\n".join(tried))


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
    cls = OutOfMemoryError if status in (GM_OUT_OF_MEMORY, GM_LIMIT) else GpumemError
    return cls(msg, status, name)


def _check(status, what):
    if status != GM_OK:
        raise _error(status, what)


def _pool(device=None):
    lib = _library()[0]
    p = ctypes.c_void_p()
    if device is None:
        _check(lib.gm_default_pool(ctypes.byref(p)), "gm_default_pool")
    else:
        _check(lib.gm_device_pool(int(device), ctypes.byref(p)), "gm_device_pool(%d)" % int(device))
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
    lib = _library()[0]
    released = ctypes.c_size_t()
    _check(lib.gm_trim(_pool(device), int(keep), ctypes.byref(released)), "gm_trim")
    return released.value


def _trim_all():
    """gm_trim(0) on every pool the library has created (errors to stderr)."""
    _library()[0].gm_torch_empty_cache()


def forget_stream(stream, device=None):
    """Call before destroying a stream that memory was freed on (a CUDA stream
    handle as an int, e.g. cupy.cuda.Stream.ptr or torch.cuda.Stream.cuda_stream):
    waits for it if the pool holds blocks freed on it and makes them usable
    by every stream, so the pool never records an event on it again."""
    lib = _library()[0]
    _check(lib.gm_stream_forget(_pool(device), ctypes.c_void_p(int(stream))), "gm_stream_forget")


def set_limit(limit, device=None):
    """Set the pool's hard limit on reserved bytes (0: the device's memory)."""
    lib = _library()[0]
    _check(lib.gm_pool_set_limit(_pool(device), int(limit)), "gm_pool_set_limit")


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


class Allocation:
    """Device memory from gpumem: .ptr (int), .size, .device, .stream.
    Freed by free(), by leaving a `with` block, or when collected."""

    __slots__ = ("ptr", "size", "device", "stream", "_pool", "__weakref__")

    def __init__(self, size, stream=0, device=None):
        lib = _library()[0]
        self.ptr = None
        self._pool = _pool(device)
        self.size = int(size)
        self.device = device
        self.stream = int(stream or 0)
        p = ctypes.c_void_p()
        _check(lib.gm_alloc(self._pool, self.size, ctypes.c_void_p(self.stream), ctypes.byref(p)),
               "gm_alloc(%d bytes)" % self.size)
        self.ptr = p.value or 0

    def memset(self, value, size=None):
        lib = _library()[0]
        n = self.size if size is None else int(size)
        _check(lib.gm_memset(self._pool, ctypes.c_void_p(self.ptr), int(value), n,
                             ctypes.c_void_p(self.stream)), "gm_memset")

    def free(self):
        if self.ptr:
            ptr, self.ptr = self.ptr, None
            lib = _library()[0]
            _check(lib.gm_free(self._pool, ctypes.c_void_p(ptr), ctypes.c_void_p(self.stream)), "gm_free")
        self.ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

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
    lo, hi = int(lo), int(hi)
    if lo < 1 or hi < lo:
        raise ValueError("max_batch_size: need 1 <= lo <= hi, got lo=%d hi=%d" % (lo, hi))
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


from . import cupy, torch  # noqa: E402,F401  (adapters; frameworks import lazily)
