# SPDX-License-Identifier: Apache-2.0
"""gpumem.torch — gpumem as PyTorch's CUDA allocator.

enable() hands PyTorch the two functions of libgpumem.so that
torch.cuda.memory.CUDAPluggableAllocator loads (gm_torch_alloc, gm_torch_free)
and wires the hooks PyTorch lets a plugged allocator set:

  torch.cuda.empty_cache()                   -> gm_trim of every gpumem pool
  Tensor.record_stream(s)                    -> gm_record_stream
  torch.cuda.set_per_process_memory_fraction -> the pool's limit

PyTorch's own caching layer is then out of the way: every tensor is one
allocation from the pool of its device, on its stream.  What a plugged
allocator cannot do in PyTorch (torch.cuda.memory_allocated/memory_stats/
memory_snapshot raise; use gpumem.torch.memory_stats), and how an out-of-memory
error surfaces, is in docs/python.md.  PyTorch is imported only by enable().
"""
import ctypes

import gpumem as _gm

__all__ = ["enable", "is_enabled", "hooks", "memory_stats", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "torch_memory_stats",
           "nccl_mem_pool", "TorchError"]

_state = {"enabled": False, "allocator": None, "hooks": ()}

# (method of PyTorch's allocator object, our function)
_HOOKS = (
    ("set_reset_fn", "gm_torch_empty_cache"),
    ("set_record_stream_fn", "gm_torch_record_stream"),
    ("set_memory_fraction_fn", "gm_torch_set_memory_fraction"),
)


class TorchError(RuntimeError):
    """gpumem.torch.enable() cannot plug gpumem into this PyTorch."""


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("gpumem.torch needs PyTorch (import torch failed: %s)" % e) from e
    return torch


def _too_late():
    return TorchError(
        "gpumem.torch.enable() must run before PyTorch initializes CUDA, i.e. before the first "
        "CUDA tensor, torch.cuda.init() or anything else that touches the GPU; call it right "
        "after `import torch`, at the top of the program")


def enable():
    """Make gpumem PyTorch's CUDA allocator (once per process; a second call
    is a no-op).  Raises TorchError when CUDA is already initialized, when
    PyTorch has no CUDA, or when PyTorch refuses the allocator."""
    if _state["enabled"]:
        return
    torch = _import_torch()
    lib, path = _gm._library()
    cuda = torch.cuda
    if not cuda.is_available():
        raise TorchError("gpumem.torch.enable(): PyTorch sees no CUDA device "
                         "(torch.cuda.is_available() is False)")
    if cuda.is_initialized():
        raise _too_late()
    memory = cuda.memory
    allocator = memory.CUDAPluggableAllocator(path, "gm_torch_alloc", "gm_torch_free")
    obj = allocator.allocator()
    wired = []
    for method, symbol in _HOOKS:
        setter = getattr(obj, method, None)
        if setter is None:
            continue
        setter(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
        wired.append(method)
    try:
        memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise _too_late() from e
    _state.update(enabled=True, allocator=allocator, hooks=tuple(wired))


def nccl_mem_pool():
    """A torch.cuda.MemPool whose segments are gpumem registrable segments
    (gm_alloc_registrable on the device's pool: one physical allocation
    each, made the way NCCL's ncclMemAlloc makes memory when GPUMEM_NCCL=1),
    so NCCL can register them -- e.g. ProcessGroupNCCL's register_mem_pool:

        pool = gpumem.torch.nccl_mem_pool()
        with torch.cuda.use_mem_pool(pool):
            buf = torch.empty(n, device="cuda")
        backend.register_mem_pool(pool)

    PyTorch's caching allocator carves tensors out of the segments; the rest
    of the program keeps whatever allocator it has.  What was measured, and
    what PyTorch refuses (register_mem_pool while gpumem.torch.enable() is
    PyTorch's allocator), is in docs/multigpu.md.  Needs a PyTorch with
    torch.cuda.MemPool (2.6 or later); TorchError otherwise."""
    torch = _import_torch()
    cuda = torch.cuda
    if not hasattr(cuda, "MemPool"):
        raise TorchError("gpumem.torch.nccl_mem_pool(): this PyTorch (%s) has no torch.cuda.MemPool"
                         % torch.__version__)
    lib, path = _gm._library()
    allocator = cuda.memory.CUDAPluggableAllocator(path, "gm_torch_alloc_registrable",
                                                   "gm_torch_free")
    pool = cuda.MemPool(allocator.allocator())
    try:
        pool._gpumem_allocator = allocator  # keep the Python side alive with the pool
    except AttributeError:
        _state.setdefault("pools", []).append(allocator)
    return pool


def is_enabled():
    """Whether enable() has plugged gpumem into PyTorch in this process."""
    return _state["enabled"]


def hooks():
    """The PyTorch allocator hooks enable() wired (names of the setters)."""
    return _state["hooks"]


def _device_index(device):
    """A CUDA device as PyTorch names it -- None (the current device), an
    int, "cuda" / "cuda:N", or a torch.device of type cuda -- as an ordinal.
    TypeError / gpumem.InvalidArgumentError for anything else."""
    if isinstance(device, str):
        kind, sep, index = device.partition(":")
        if kind != "cuda":
            raise _gm.InvalidArgumentError("device %r is not a CUDA device" % device)
        if not sep:
            device = None
        elif index.isdigit() and index.isascii():
            device = int(index)
        else:
            raise _gm.InvalidArgumentError("device %r: the index after 'cuda:' must be a "
                                           "non-negative int" % device)
    elif hasattr(device, "type") and hasattr(device, "index"):  # a torch.device
        if device.type != "cuda":
            raise _gm.InvalidArgumentError("device %r is not a CUDA device" % (device,))
        device = device.index
    if device is None:
        device = _import_torch().cuda.current_device()
    return _gm._device(device)


def memory_stats(device=None):
    """gpumem's statistics of the pool behind a CUDA device (default: the
    current one; an int, "cuda:N" or a torch.device): what
    torch.cuda.memory_stats() cannot give for a plugged allocator.
    'allocated' is the bytes PyTorch asked for and holds."""
    return _gm.stats(_device_index(device))


# Drop-in replacements for the torch.cuda calls a plugged allocator cannot
# answer (PyTorch raises "CUDAPluggableAllocator does not yet support
# getDeviceStats"): same names, same arguments, same meanings, from the
# pool behind the device.

def memory_allocated(device=None):
    """torch.cuda.memory_allocated: bytes of live tensors on the device."""
    return memory_stats(device)["allocated"]


def max_memory_allocated(device=None):
    """torch.cuda.max_memory_allocated: the peak of memory_allocated since
    the start or reset_peak_memory_stats."""
    return memory_stats(device)["allocated_peak"]


def memory_reserved(device=None):
    """torch.cuda.memory_reserved: device memory the allocator holds (live
    and cached)."""
    return memory_stats(device)["reserved"]


def max_memory_reserved(device=None):
    """torch.cuda.max_memory_reserved: the peak of memory_reserved."""
    return memory_stats(device)["reserved_peak"]


def reset_peak_memory_stats(device=None):
    """torch.cuda.reset_peak_memory_stats: peaks start again from now."""
    _gm.reset_peaks(_device_index(device))


def torch_memory_stats(device=None):
    """The keys of torch.cuda.memory_stats() that have a gpumem meaning,
    under PyTorch's names ("allocated_bytes.all.current", ...); the rest of
    gpumem's figures are in memory_stats()."""
    s = memory_stats(device)
    return {
        "allocated_bytes.all.current": s["allocated"],
        "allocated_bytes.all.peak": s["allocated_peak"],
        "allocated_bytes.all.allocated": s["allocated_total"],
        "allocated_bytes.all.freed": s["freed_total"],
        "active_bytes.all.current": s["active"],
        "active_bytes.all.peak": s["active_peak"],
        "reserved_bytes.all.current": s["reserved"],
        "reserved_bytes.all.peak": s["reserved_peak"],
        "inactive_split_bytes.all.current": s["inactive_split"],
        "allocation.all.current": s["live_blocks"],
        "allocation.all.allocated": s["alloc_count"],
        "allocation.all.freed": s["free_count"],
        "num_alloc_retries": s["retries"],
        "num_ooms": s["oom_count"],
    }
