# SPDX-License-Identifier: Apache-2.0
"""gpumem.torch — gpumem as PyTorch's CUDA allocator.

enable() makes gpumem the allocator of every CUDA tensor, in one of two ways:

  "native"    a C++ allocator class (torch_allocator.cpp beside this file)
              compiled on first use against the imported PyTorch and cached;
              PyTorch's own features keep working on gpumem: memory_stats /
              memory_summary / memory_allocated, cudnn.benchmark, CUDA graphs
              and torch.compile(mode="reduce-overhead") (private graph pools),
              torch.cuda.MemPool, OOM observers and torch.cuda.OutOfMemoryError.
  "pluggable" PyTorch's CUDAPluggableAllocator over two C functions of
              libgpumem.so (gm_torch_alloc, gm_torch_free) and the hooks it
              lets a plugged allocator set (empty_cache, record_stream,
              memory fraction).  Needs no compiler; PyTorch refuses the
              features above for a plugged allocator (docs/python.md).

The default, "auto", is native when a C++ compiler builds the class and
pluggable otherwise (with a warning saying why).  GPUMEM_TORCH_ALLOCATOR
(auto, native, pluggable) chooses when enable() is given no choice.  Either
way PyTorch's own caching layer is out of the way: every tensor is one
allocation from the pool of its device, on its stream.  PyTorch is imported
only by enable().
"""
import ctypes
import ctypes.util
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import gpumem as _gm

__all__ = ["enable", "is_enabled", "hooks", "allocator_kind", "build_native", "memory_stats", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "torch_memory_stats",
           "nccl_mem_pool", "TorchError"]

_state = {"enabled": False, "allocator": None, "hooks": (), "kind": None, "native": None}

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


_KINDS = ("auto", "native", "pluggable")


def enable(allocator=None):
    """Make gpumem PyTorch's CUDA allocator (once per process; a second call
    is a no-op).  allocator: "auto" (the default; GPUMEM_TORCH_ALLOCATOR when
    None), "native" or "pluggable" (see the module's text).  Raises
    TorchError when CUDA is already initialized, when PyTorch has no CUDA,
    when PyTorch refuses the allocator, or when "native" was asked for and
    cannot be built; gpumem.InvalidArgumentError for an unknown choice."""
    if _state["enabled"]:
        return
    if allocator is None:
        allocator = os.environ.get("GPUMEM_TORCH_ALLOCATOR", "") or "auto"
    if allocator not in _KINDS:
        raise _gm.InvalidArgumentError("gpumem.torch.enable(allocator=%r): choose one of %s "
                                       "(GPUMEM_TORCH_ALLOCATOR too)" % (allocator, ", ".join(_KINDS)))
    torch = _import_torch()
    lib, path = _gm._library()
    cuda = torch.cuda
    if not cuda.is_available():
        raise TorchError("gpumem.torch.enable(): PyTorch sees no CUDA device "
                         "(torch.cuda.is_available() is False)")
    if cuda.is_initialized():
        raise _too_late()
    if allocator in ("auto", "native"):
        try:
            so = build_native()
        except TorchError as e:
            if allocator == "native":
                raise
            warnings.warn("gpumem.torch.enable(): the native allocator cannot be built (%s); "
                          "using PyTorch's CUDAPluggableAllocator, which lacks memory_stats, "
                          "cudnn.benchmark, torch.compile(mode='reduce-overhead') and MemPool "
                          "(docs/python.md)" % e, RuntimeWarning, stacklevel=2)
        else:
            _install_native(lib, path, so)
            return
    _install_pluggable(torch, lib, path)


def _install_pluggable(torch, lib, path):
    memory = torch.cuda.memory
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
    _state.update(enabled=True, allocator=allocator, hooks=tuple(wired), kind="pluggable")


def _install_native(lib, path, so):
    # The class calls gm_* functions it leaves undefined: libgpumem.so (this
    # process's copy, already loaded) provides them once made global.
    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    native = ctypes.CDLL(so, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    native.gm_torch_native_install.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
    native.gm_torch_native_install.restype = ctypes.c_int
    err = ctypes.create_string_buffer(1024)
    rc = native.gm_torch_native_install(err, len(err))
    if rc == 1:
        raise _too_late()
    if rc != 0:
        raise TorchError("gpumem.torch.enable(): PyTorch refused the native allocator: %s"
                         % err.value.decode(errors="replace"))
    _state.update(enabled=True, allocator=native, hooks=(), kind="native", native=so)


def allocator_kind():
    """"native" or "pluggable" once enable() has run; None before."""
    return _state["kind"]


def _cache_dirs():
    """(directory, check it is private) where the compiled allocator may be
    kept, in order: GPUMEM_CACHE_DIR alone when set; else
    $XDG_CACHE_HOME/gpumem (~/.cache/gpumem), then, for a home that cannot
    be written (a read-only container), a directory of this user's own in
    the temporary directory."""
    d = os.environ.get("GPUMEM_CACHE_DIR")
    if d:
        return [(d, False)]  # the user's choice: not second-guessed
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [(os.path.join(base, "gpumem"), True),
            (os.path.join(tempfile.gettempdir(), "gpumem-%d" % os.getuid()), True)]


def _private_dir(d):
    """d exists, is a directory (not a link) of this user that no one else
    may write; made so (mode 0700) when missing.  OSError otherwise: a
    library found in a directory others can write could be anybody's."""
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    import stat
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError("%s is not a directory of this user's that only it may write" % d)


def _header_dir():
    """The directory holding gpumem.h: the package's copy (a wheel carries
    one), else the checkout's include/."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "include"), os.path.join(here, os.pardir, os.pardir, "include")):
        if os.path.exists(os.path.join(d, "gpumem.h")):
            return os.path.normpath(d)
    raise TorchError("gpumem.h is found neither in the package nor in a checkout beside it")


def _build_command(torch, src, out):
    try:
        from torch.utils import cpp_extension
    except ImportError as e:
        raise TorchError("torch.utils.cpp_extension cannot be imported: %s" % e) from e
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise TorchError("no C++ compiler found (set CXX, or install g++)")
    cuda_home = cpp_extension.CUDA_HOME
    if not cuda_home:
        raise TorchError("the CUDA toolkit is not found (torch.utils.cpp_extension.CUDA_HOME is unset; "
                         "set CUDA_HOME)")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
           "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-I", _header_dir()]
    for inc in cpp_extension.include_paths():
        cmd += ["-isystem", inc]
    cmd += ["-isystem", os.path.join(cuda_home, "include"), src, "-o", out]
    for libdir in cpp_extension.library_paths():
        cmd += ["-L", libdir, "-Wl,-rpath," + libdir]
    cmd += ["-L", os.path.join(cuda_home, "lib64"), "-lc10", "-lc10_cuda", "-ltorch_cuda", "-lcudart"]
    # The C++ runtime PyTorch uses, by its shared object's name: where the
    # compiler's development link (libstdc++.so) is missing, a plain -lstdc++
    # would link the static archive, whose second copy of the library's
    # globals (locales) crashes the first time a message is formatted.
    runtime = ctypes.util.find_library("stdc++")
    if runtime:
        cmd.append("-l:" + runtime)
    return cmd


def build_native(force=False):
    """Compile the native allocator for the imported PyTorch (once; cached in
    GPUMEM_CACHE_DIR, else ~/.cache/gpumem, else a private directory in the
    temporary directory; keyed by PyTorch's version, the source, the header
    and the command) and return the library's path.
    TorchError, with the compiler's output, when it cannot be built."""
    torch = _import_torch()
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "torch_allocator.cpp")
    if not os.path.exists(src):
        raise TorchError("%s is missing from the package" % src)
    cmd = _build_command(torch, src, "OUT")
    key = hashlib.sha256()
    for part in (torch.__version__, sys.version, " ".join(cmd)):
        key.update(part.encode())
    for f in (src, os.path.join(_header_dir(), "gpumem.h")):
        with open(f, "rb") as fh:
            key.update(fh.read())
    leaf = "torch-%s-%s" % (torch.__version__.replace("+", "_"), key.hexdigest()[:16])
    tried = []
    for top, check in _cache_dirs():
        d = os.path.join(top, leaf)
        so = os.path.join(d, "libgpumem_torch.so")
        try:
            if check:
                _private_dir(top)
            if os.path.exists(so) and not force:
                return so
            os.makedirs(d, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=d)
            os.close(fd)
            break
        except OSError as e:
            tried.append("%s (%s)" % (top, e))
    else:
        raise TorchError("no place to keep the native allocator: %s; set GPUMEM_CACHE_DIR"
                         % "; ".join(tried))
    try:
        cmd = _build_command(torch, src, tmp)
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TorchError("compiling %s failed: %s" % (src, e)) from e
        if r.returncode != 0:
            tail = r.stdout.decode(errors="replace")[-3000:]
            raise TorchError("compiling %s failed (exit %d): %s\n%s"
                             % (src, r.returncode, " ".join(cmd), tail))
        os.replace(tmp, so)  # atomic: a concurrent build leaves one whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return so


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
