# SPDX-License-Identifier: Apache-2.0
"""gpumem.cupy — gpumem as CuPy's device allocator (cupy.cuda.set_allocator).

Every CuPy array then lives in the pool of its device, allocated and freed
on CuPy's current stream at allocation time; CuPy's own memory pool is out
of the way.  An allocation that does not fit raises CuPy's
cupy.cuda.memory.OutOfMemoryError; a size that is not an int in [0, 2**63]
raises TypeError / gpumem.InvalidArgumentError before the library is called.  CuPy is imported only by enable().
"""
import ctypes

import gpumem as _gm

__all__ = ["enable", "is_enabled", "disable"]

_state = {"enabled": False, "previous": None}


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


def enable():
    """Route CuPy's device allocations through gpumem (a second call is a no-op)."""
    if _state["enabled"]:
        return
    try:
        import cupy
    except ImportError as e:
        raise ImportError("gpumem.cupy needs CuPy (import cupy failed: %s)" % e) from e
    lib = _gm._library()[0]
    memory = cupy.cuda.memory

    def malloc(size):
        size = _gm._size(size, "gpumem.cupy allocator: size")  # TypeError / InvalidArgumentError
        device = cupy.cuda.runtime.getDevice()
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

    _state["previous"] = memory.get_allocator() if hasattr(memory, "get_allocator") else None
    cupy.cuda.set_allocator(malloc)
    _state["enabled"] = True


def disable():
    """Give CuPy back the allocator it had before enable()."""
    if not _state["enabled"]:
        return
    import cupy
    cupy.cuda.set_allocator(_state["previous"])
    _state.update(enabled=False, previous=None)


def is_enabled():
    return _state["enabled"]
