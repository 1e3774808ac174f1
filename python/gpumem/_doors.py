# SPDX-License-Identifier: Apache-2.0
"""What gpumem.vllm and gpumem.tms share: a door's tag (one gpumem tag and
the pools it was used in), the check that PyTorch's allocations reach
gpumem, and offload / restore / figures of a tag over every pool it knows.

Not a public module: its names may change.  docs/sleep.md describes the doors.
"""
import contextlib
import ctypes
import sys
import threading

import gpumem as _gm

GM_INVALID_STATE = 14  # the library's status of the same name


class SleepStateError(_gm.GpumemError):
    """A sleep, wake, pause or resume that does not fit the door's state:
    sleeping twice, waking what is not asleep.  Nothing was changed."""

    def __init__(self, message):
        super().__init__(message, GM_INVALID_STATE, "GM_INVALID_STATE")


def route_allocations(what):
    """Make sure the allocations a door tags reach gpumem.

    Without PyTorch (raw gpumem.alloc, CuPy under gpumem.cupy) they do.  When
    PyTorch is imported and can use CUDA, its tensors reach gpumem only under
    gpumem.torch: enable it now if CUDA is not initialized yet; if that is too
    late, raise, because a tag would then hold none of the tensors and a sleep
    would free nothing, silently."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    gtorch = _gm.torch
    if gtorch.is_enabled() or _gm.cupy.is_enabled():
        return
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available():
            return  # no CUDA tensors can be made: nothing to route
    except Exception:  # noqa: BLE001 -- a PyTorch without a usable CUDA runtime
        return
    try:
        gtorch.enable()
    except (gtorch.TorchError, ImportError) as e:
        raise _gm.GpumemError(
            "%s: PyTorch's CUDA tensors do not go through gpumem in this process, so a tag would "
            "hold none of them and a sleep would free nothing. Call gpumem.torch.enable() right "
            "after `import torch`, before CUDA initializes (docs/sleep.md). enable() now says: %s"
            % (what, e)) from e


def check_name(name, what, room):
    """A door's tag name: a str of 1 to `room` bytes in UTF-8, no NUL."""
    if not isinstance(name, str):
        raise TypeError("%s: a tag must be a str, not %s" % (what, type(name).__name__))
    raw = name.encode("utf-8", errors="surrogateescape")
    if not 1 <= len(raw) <= room or "\0" in name:
        raise _gm.InvalidArgumentError("%s: a tag is 1 to %d bytes of UTF-8 without NUL, got %r"
                                       % (what, room, name))
    return name


class DoorTag:
    """One gpumem tag of a door and the pools it was used in (pool address ->
    device ordinal, or None for the default pool), in the order first seen."""

    __slots__ = ("name", "tag", "pools")

    def __init__(self, name, tag):
        self.name = name      # the door's name (e.g. "weights")
        self.tag = tag        # the gpumem.Tag
        self.pools = {}

    def note_pool(self):
        """Record the pool of the device the framework works on now."""
        device = _gm._current_device()
        pool = _gm._pool(device).value
        if pool not in self.pools:
            self.pools[pool] = device

    @contextlib.contextmanager
    def scope(self):
        """This thread's allocations carry the tag inside the block."""
        self.note_pool()
        try:
            with self.tag:
                yield
        finally:
            self.note_pool()  # the current device may have changed inside

    def offload(self, discard):
        """gm_offload in every pool of the tag; returns the pools done.  On a
        failure the exception carries .pools_done (those fully offloaded)."""
        done = []
        lib = _gm._tag_lib("offload")
        for pool, device in list(self.pools.items()):
            stream = _gm._default_stream(None, device, "offload")
            status = lib.gm_offload(ctypes.c_void_p(pool), self.tag.id,
                                    _gm._OFFLOAD_DISCARD if discard else 0, ctypes.c_void_p(stream))
            if status != _gm.GM_OK:
                e = _gm._error(status, "gm_offload(%r)" % self.tag.name)
                e.pools_done = done
                raise e
            done.append(pool)
        return done

    def restore(self, pools=None):
        """gm_restore in every pool of the tag (or those named); all or
        nothing per pool.  On a failure .pools_done names the pools woken."""
        done = []
        lib = _gm._tag_lib("restore")
        for pool in (list(self.pools) if pools is None else pools):
            device = self.pools[pool]
            stream = _gm._default_stream(None, device, "restore")
            status = lib.gm_restore(ctypes.c_void_p(pool), self.tag.id, ctypes.c_void_p(stream))
            if status != _gm.GM_OK:
                e = _gm._error(status, "gm_restore(%r)" % self.tag.name)
                e.pools_done = done
                raise e
            done.append(pool)
        return done

    def prepare(self, background):
        """Pin the host memory of the tag's next sleep ahead, in every pool
        it has memory in (gm_offload_prepare; GM_PREPARE_ASYNC when
        background)."""
        lib = _gm._prepare_lib("prepare")
        for pool in list(self.pools):
            _gm._check(lib.gm_offload_prepare(ctypes.c_void_p(pool), self.tag.id, 1 if background else 0),
                       "gm_offload_prepare(%r)" % self.tag.name)

    def info(self):
        """The tag's figures summed over its pools (gm_tag_info)."""
        lib = _gm._tag_lib("tag_info")
        out = {"resident_blocks": 0, "resident_bytes": 0, "offloaded_blocks": 0, "offloaded_bytes": 0,
               "offloads": 0, "restores": 0}
        for pool in list(self.pools):  # a scope on another thread may add one
            info = _gm._TagInfo()
            info.size = ctypes.sizeof(_gm._TagInfo)
            info.version = _gm._TAG_INFO_VERSION
            _gm._check(lib.gm_tag_info(ctypes.c_void_p(pool), self.tag.id, ctypes.byref(info)),
                       "gm_tag_info(%r)" % self.tag.name)
            for field in out:
                out[field] += getattr(info, field)
        return out


def trim_pools(door_tags):
    """gm_trim(0) of every pool of these door tags: cached memory back to the
    device (what torch.cuda.empty_cache() does under gpumem.torch)."""
    lib = _gm._library()[0]
    released = ctypes.c_size_t()
    pools = {pool for dt in door_tags for pool in list(dt.pools)}
    for pool in pools:
        lib.gm_trim(ctypes.c_void_p(pool), 0, ctypes.byref(released))


@contextlib.contextmanager
def untagged():
    """This thread's allocations carry no tag inside the block."""
    lib = _gm._tag_lib("untagged")
    old = lib.gm_tag_scope(0)  # GM_TAG_NONE
    try:
        yield
    finally:
        lib.gm_tag_scope(old)


def new_lock():
    return threading.RLock()


def note(exc, text):
    """Add a line to an exception's message (PEP 678 notes where Python has them)."""
    if hasattr(exc, "add_note"):
        exc.add_note(text)

