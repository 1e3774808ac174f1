# SPDX-License-Identifier: Apache-2.0
"""gpumem.cupy — gpumem as CuPy's device allocator (cupy.cuda.set_allocator).

Every CuPy array then lives in the pool of its device, allocated on CuPy's
current stream and freed on the stream it was allocated on; CuPy's own
memory pool is out of the way.  An allocation that does not fit raises
CuPy's cupy.cuda.memory.OutOfMemoryError.  Two paths:

  "c"       cupy.cuda.memory.CFunctionAllocator over gm_cupy_malloc /
            gm_cupy_free of libgpumem.so: no Python runs per allocation.
            Needs CuPy's C function for the current stream
            (cupy.cuda.stream's Cython C-API table, get_current_stream_ptr).
  "python"  a Python function per allocation (ctypes); any CuPy; sizes that
            are not an int in [0, 2**63] raise TypeError /
            gpumem.InvalidArgumentError before the library is called.

"auto" (the default; GPUMEM_CUPY_ALLOCATOR chooses when enable() is given
no choice) takes "c" where CuPy offers what it needs.  CuPy is imported only
by enable().
"""
import ctypes
import os
import threading

import gpumem as _gm

__all__ = ["enable", "is_enabled", "disable", "path"]

_state = {"enabled": False, "previous": None, "path": None, "keep": None}
# Threads on which the Python path has made the device current.
_thread = threading.local()
_PATHS = ("auto", "c", "python")
# The signature Cython records for cupy.cuda.stream.get_current_stream_ptr.
_STREAM_FN_SIGNATURE = b"intptr_t (void)"


class _Hooks(ctypes.Structure):
    """gm_cupy_hooks_t of include/gpumem.h."""
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint),
                ("current_stream", ctypes.c_void_p), ("build_value", ctypes.c_void_p),
                ("set_object", ctypes.c_void_p), ("decref", ctypes.c_void_p),
                ("oom_type", ctypes.c_void_p), ("error_type", ctypes.c_void_p)]


_HOOKS_VERSION = 1


def _addr(fn):
    return ctypes.cast(fn, ctypes.c_void_p).value


def _stream_fn(cupy):
    """The address of CuPy's C get_current_stream_ptr, or (None, why)."""
    import importlib
    try:
        mod = importlib.import_module("cupy.cuda.stream")
    except ImportError as e:
        return None, "cupy.cuda.stream cannot be imported: %s" % e
    capi = getattr(mod, "__pyx_capi__", None) or {}
    cap = capi.get("get_current_stream_ptr")
    if cap is None:
        return None, "this CuPy (%s) exports no C get_current_stream_ptr" % getattr(cupy, "__version__", "?")
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = api.PyCapsule_GetName(cap)
    if name != _STREAM_FN_SIGNATURE:
        return None, "CuPy's get_current_stream_ptr has the signature %r, not %r" % (name, _STREAM_FN_SIGNATURE)
    return api.PyCapsule_GetPointer(cap, name), None


def _c_allocator(cupy, lib):
    """(CuPy's allocator over gm_cupy_malloc/gm_cupy_free, what keeps it
    alive), or (None, why not)."""
    memory = cupy.cuda.memory
    if not hasattr(memory, "CFunctionAllocator"):
        return None, "this CuPy has no cupy.cuda.memory.CFunctionAllocator"
    fn, why = _stream_fn(cupy)
    if fn is None:
        return None, why
    api = ctypes.pythonapi
    hooks = _Hooks(ctypes.sizeof(_Hooks), _HOOKS_VERSION, fn, _addr(api.Py_BuildValue),
                   _addr(api.PyErr_SetObject), _addr(api.Py_DecRef),
                   id(memory.OutOfMemoryError), id(_gm.GpumemError))
    # The hooks hold borrowed references: keep the types with them.
    keep = (hooks, memory.OutOfMemoryError, _gm.GpumemError)
    alloc = memory.CFunctionAllocator(ctypes.addressof(hooks), _addr(lib.gm_cupy_malloc),
                                      _addr(lib.gm_cupy_free), keep)
    return alloc, keep


class _Block:
    """Owner of one gpumem block; frees it when CuPy drops its memory."""

    __slots__ = ("ptr", "stream", "pool")

    def __init__(self, ptr, stream, pool):
        self.ptr, self.stream, self.pool = ptr, stream, pool

    def __del__(self):
        if not self.ptr:
            return
        try:
            lib = _gm._library()[0]
            lib.gm_free(self.pool, ctypes.c_void_p(self.ptr), ctypes.c_void_p(self.stream))
        except Exception:  # interpreter shutdown
            pass
        self.ptr = 0


def enable(path=None):
    """Route CuPy's device allocations through gpumem (a second call is a
    no-op).  path: "auto" (the default; GPUMEM_CUPY_ALLOCATOR when None),
    "c" or "python" (see the module's text).  gpumem.InvalidArgumentError for
    an unknown choice; RuntimeError when "c" was asked for and this CuPy
    cannot take it."""
    if _state["enabled"]:
        return
    if path is None:
        path = os.environ.get("GPUMEM_CUPY_ALLOCATOR", "") or "auto"
    if path not in _PATHS:
        raise _gm.InvalidArgumentError("gpumem.cupy.enable(path=%r): choose one of %s "
                                       "(GPUMEM_CUPY_ALLOCATOR too)" % (path, ", ".join(_PATHS)))
    try:
        import cupy
    except ImportError as e:
        raise ImportError("gpumem.cupy needs CuPy (import cupy failed: %s)" % e) from e
    lib = _gm._library()[0]
    memory = cupy.cuda.memory
    previous = memory.get_allocator() if hasattr(memory, "get_allocator") else None
    if path in ("auto", "c"):
        alloc, keep = _c_allocator(cupy, lib)
        if alloc is not None:
            cupy.cuda.set_allocator(alloc.malloc)
            _state.update(enabled=True, previous=previous, path="c", keep=(alloc, keep))
            return
        if path == "c":
            raise RuntimeError("gpumem.cupy.enable(path='c'): %s" % keep)

    def malloc(size):
        size = _gm._size(size, "gpumem.cupy allocator: size")  # TypeError / InvalidArgumentError
        device = cupy.cuda.runtime.getDevice()
        if not getattr(_thread, "adopted", False):
            # As the C path does (gm_cupy_malloc): on a thread where no
            # context is current, every CUDA runtime call CuPy makes per
            # allocation takes a slow path; cudaSetDevice to the device the
            # thread already reads makes its primary context current there.
            cupy.cuda.runtime.setDevice(device)
            _thread.adopted = True
        stream = _gm._stream(cupy.cuda.get_current_stream().ptr, "CuPy's current stream")
        pool = _gm._pool(device)
        p = ctypes.c_void_p()
        rc = lib.gm_alloc(pool, size, ctypes.c_void_p(stream), ctypes.byref(p))
        if rc != _gm.GM_OK:
            err = _gm._error(rc, "gm_alloc(%d bytes) for CuPy" % size)
            if isinstance(err, _gm.OutOfMemoryError):
                raise memory.OutOfMemoryError(size, _gm.stats(device)["reserved"]) from err
            raise err
        owner = _Block(p.value or 0, stream, pool)
        mem = memory.UnownedMemory(p.value or 0, size, owner, device)
        return memory.MemoryPointer(mem, 0)

    cupy.cuda.set_allocator(malloc)
    _state.update(enabled=True, previous=previous, path="python", keep=None)


def disable():
    """Give CuPy back the allocator it had before enable()."""
    if not _state["enabled"]:
        return
    import cupy
    cupy.cuda.set_allocator(_state["previous"])
    # The C path's hooks stay alive: arrays made before may still be freed.
    _state.update(enabled=False, previous=None, path=None)


def is_enabled():
    return _state["enabled"]


def path():
    """"c" or "python" while enabled; None otherwise."""
    return _state["path"]
