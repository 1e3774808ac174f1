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

__all__ = ["enable", "is_enabled", "hooks", "memory_stats", "nccl_mem_pool", "TorchError"]

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
                                                   "gm_torch_free_registrable")
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
