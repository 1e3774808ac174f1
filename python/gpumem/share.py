# SPDX-License-Identifier: Apache-2.0
"""gpumem.share — publish device memory to other processes, import theirs.

The exporter puts what it wants to share in a shareable Buffer (memory on
pages of its own), and publishes it on a Server:

    buf = gpumem.share.Buffer(8 << 30)                 # or Buffer.like(...)
    w = buf.as_tensor(torch.float16, (4096, 1 << 20))  # torch/cupy views of it
    srv = gpumem.share.Server("/run/user/1000/model.sock")
    srv.publish("weights", buf, read_only=True)

Another process imports it, with no copy, and no rule that the exporter must
outlive it (the memory stays valid until the importer releases it):

    cli = gpumem.share.Client("/run/user/1000/model.sock")
    imp = cli.open("weights")
    w = imp.as_tensor(torch.float16, (4096, 1 << 20))  # read-only on the GPU
    ...
    imp.release()

Imports and Buffers carry __cuda_array_interface__ (a flat uint8 array), so
cupy.asarray(imp) and torch.as_tensor(imp, device="cuda") work too.  The
rules (who may connect, tokens, what happens when either side dies) are those
of docs/sharing.md; errors are gpumem.GpumemError with the library's message.
"""
import ctypes
import os
import threading

from . import InvalidArgumentError, _check, _device, _integer, _library, _pool, _size, _stream

__all__ = ["Buffer", "Server", "Client", "Import", "stats", "READ_WRITE", "READ_ONLY"]

READ_WRITE = 0
READ_ONLY = 1
_ANY_UID = 0x1
_NAME_MAX = 63

_c = ctypes
_P = _c.POINTER


class _Policy(_c.Structure):
    _fields_ = [("size", _c.c_size_t), ("version", _c.c_uint), ("flags", _c.c_uint),
                ("allow_gid", _c.c_long), ("max_peers", _c.c_uint)]


_STAT_NAMES = ("servers", "published", "published_bytes", "exported_bytes",
               "held_for_peers_bytes", "peers", "peers_refused", "peers_dropped", "imports",
               "imported_bytes")


class _Range(_c.Structure):
    _fields_ = [("ptr", _c.c_void_p), ("size", _c.c_size_t)]


class _Stats(_c.Structure):
    _fields_ = [("size", _c.c_size_t), ("version", _c.c_uint)] + \
               [(n, _c.c_uint64) for n in _STAT_NAMES]


_declared = False
_lock = threading.Lock()


def _lib():
    global _declared
    lib = _library()[0]
    if _declared:
        return lib
    with _lock:
        sz, vp, cp, ci = _c.c_size_t, _c.c_void_p, _c.c_char_p, _c.c_int
        sigs = {
            "gm_alloc_shareable": [vp, sz, vp, _P(vp)],
            "gm_share_listen": [vp, cp, _P(_Policy), _P(vp)],
            "gm_share_publish": [vp, cp, vp, sz, ci, cp, vp],
            "gm_share_publish_ranges": [vp, cp, _P(_Range), sz, ci, cp, vp],
            "gm_share_import_ranges": [vp, cp, cp, _P(_Range), sz, _P(sz), _P(ci)],
            "gm_share_unpublish": [vp, cp],
            "gm_share_close": [vp],
            "gm_share_connect": [vp, cp, _P(vp)],
            "gm_share_import": [vp, cp, cp, _P(vp), _P(sz), _P(ci)],
            "gm_share_release": [vp, vp, vp],
            "gm_share_disconnect": [vp],
            "gm_share_stats": [vp, _P(_Stats)],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.restype = ci
            fn.argtypes = args
        _declared = True
    return lib


def _name(value, what):
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    b = value.encode()
    if not 1 <= len(b) <= _NAME_MAX or any(c < 0x21 or c > 0x7e for c in b):
        raise InvalidArgumentError("%s must be 1 to %d printable ASCII characters without "
                                   "spaces, got %r" % (what, _NAME_MAX, value))
    return b


def _path(path):
    p = os.fsencode(path)
    if not p or len(p) > 107:
        raise InvalidArgumentError("socket path must have 1 to 107 bytes, got %r" % (path,))
    return p


# torch / numpy-style dtypes to __cuda_array_interface__ typestrs.
_TYPESTR = {"float16": "<f2", "bfloat16": "<V2", "float32": "<f4", "float64": "<f8",
            "int8": "|i1", "uint8": "|u1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
            "bool": "|b1"}


class _View:
    """A typed window on device memory, for torch.as_tensor / cupy.asarray."""

    def __init__(self, owner, ptr, typestr, shape):
        self._owner = owner  # keeps the memory's owner referenced
        # PyTorch refuses the read-only flag of the interface; a read-only
        # import stays read-only all the same: the device refuses writes.
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "version": 3, "strides": None}


def _as_tensor(owner, ptr, nbytes, dtype, shape, offset):
    import torch  # only when asked for
    name = str(dtype).replace("torch.", "")
    elem = torch.empty((), dtype=dtype).element_size()
    count = 1
    for d in shape:
        count *= _size(d, "shape")
    offset = _size(offset, "offset")
    if offset + count * elem > nbytes:
        raise InvalidArgumentError("%d elements of %d bytes at offset %d do not fit in %d bytes"
                                   % (count, elem, offset, nbytes))
    if name == "bfloat16":  # no typestr of its own: a uint16 view, reinterpreted
        v = _View(owner, ptr + offset, "<u2", shape)
        return torch.as_tensor(v, device="cuda").view(torch.bfloat16)
    if name not in _TYPESTR:
        raise InvalidArgumentError("dtype %s is not supported" % dtype)
    return torch.as_tensor(_View(owner, ptr + offset, _TYPESTR[name], shape), device="cuda")


class _Owned:
    """Closed by close(), a `with` block, or when collected."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class Buffer(_Owned):
    """Shareable device memory (gm_alloc_shareable): .ptr, .size, .device.
    Freed by free(), a `with` block or when collected — if it is published or
    imported then, the memory stays until the last importer lets go."""

    def __init__(self, size, stream=0, device=None):
        self._ptr = None
        self._size = _size(size, "Buffer: size")
        self._stream = _stream(stream)
        self._device = _device(device)
        self._pool = _pool(device)
        p = _c.c_void_p()
        _check(_lib().gm_alloc_shareable(self._pool, self._size, _c.c_void_p(self._stream),
                                         _c.byref(p)), "gm_alloc_shareable(%d bytes)" % self._size)
        self._ptr = p.value or 0

    ptr = property(lambda self: self._ptr)
    size = property(lambda self: self._size)
    device = property(lambda self: self._device)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self._size,), "typestr": "|u1", "data": (self._ptr, False),
                "version": 3, "strides": None}

    def as_tensor(self, dtype, shape, offset=0):
        """A torch tensor over part of the buffer (no copy)."""
        return _as_tensor(self, self._ptr, self._size, dtype, shape, offset)

    def free(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            _check(_lib().gm_free(self._pool, _c.c_void_p(ptr), _c.c_void_p(self._stream)),
                   "gm_free")

    close = free


def _range_of(obj, size):
    """(ptr, nbytes) of a Buffer, an int pointer (with size), a torch tensor or
    anything with __cuda_array_interface__."""
    if isinstance(obj, Buffer):
        return obj.ptr, obj.size if size is None else _size(size, "size")
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):
        n = obj.numel() * obj.element_size()
        return obj.data_ptr(), n if size is None else _size(size, "size")
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if size is None:
            raise InvalidArgumentError("publish: give size= with a __cuda_array_interface__ object")
        return cai["data"][0], _size(size, "size")
    if size is None:
        raise InvalidArgumentError("publish: a raw pointer needs size=")
    return _integer(obj, "ptr"), _size(size, "size")


class Server(_Owned):
    """A share server of a device's pool on a Unix socket (gm_share_listen).
    Default policy: same uid only; allow_gid admits a group, any_uid everyone."""

    def __init__(self, path, device=None, allow_gid=None, any_uid=False, max_peers=0):
        self._srv = None
        pol = _Policy(_c.sizeof(_Policy), 1, _ANY_UID if any_uid else 0,
                      -1 if allow_gid is None else _integer(allow_gid, "allow_gid"),
                      _integer(max_peers, "max_peers"))
        self._pool = _pool(device)
        s = _c.c_void_p()
        _check(_lib().gm_share_listen(self._pool, _path(path), _c.byref(pol), _c.byref(s)),
               "gm_share_listen(%s)" % (path,))
        self._srv = s
        self._keep = {}

    def publish(self, name, obj, size=None, read_only=False, token=None, stream=0):
        """Publish a Buffer (or a range of one: a tensor or pointer inside it)."""
        ptr, n = _range_of(obj, size)
        _check(_lib().gm_share_publish(self._srv, _name(name, "name"), _c.c_void_p(ptr), n,
                                       READ_ONLY if read_only else READ_WRITE,
                                       None if token is None else _name(token, "token"),
                                       _c.c_void_p(_stream(stream))), "gm_share_publish(%s)" % name)
        self._keep[name] = obj  # the object outlives its publication here

    def publish_many(self, name, objs, read_only=False, token=None, stream=0):
        """Publish several Buffers (or tensors in them) under one name: an
        importer opens them all in one request (Client.open_many)."""
        objs = list(objs)
        if not objs:
            raise InvalidArgumentError("publish_many: nothing to publish")
        arr = (_Range * len(objs))()
        for i, o in enumerate(objs):
            ptr, n = _range_of(o, None)
            arr[i].ptr, arr[i].size = ptr, n
        _check(_lib().gm_share_publish_ranges(self._srv, _name(name, "name"), arr, len(objs),
                                              READ_ONLY if read_only else READ_WRITE,
                                              None if token is None else _name(token, "token"),
                                              _c.c_void_p(_stream(stream))),
               "gm_share_publish_ranges(%s)" % name)
        self._keep[name] = objs

    def unpublish(self, name):
        _check(_lib().gm_share_unpublish(self._srv, _name(name, "name")),
               "gm_share_unpublish(%s)" % name)
        self._keep.pop(name, None)

    def close(self):
        srv, self._srv = self._srv, None
        if srv:
            _check(_lib().gm_share_close(srv), "gm_share_close")
        self._keep.clear()


class Import:
    """Memory imported from another process: .ptr, .size, .read_only."""

    def __init__(self, client, ptr, size, read_only):
        self._client, self._ptr, self._size, self._ro = client, ptr, size, read_only

    ptr = property(lambda self: self._ptr)
    size = property(lambda self: self._size)
    read_only = property(lambda self: self._ro)

    @property
    def __cuda_array_interface__(self):
        if self._ptr is None:
            raise ValueError("the import was released")
        return {"shape": (self._size,), "typestr": "|u1", "data": (self._ptr, self._ro),
                "version": 3, "strides": None}

    def as_tensor(self, dtype, shape, offset=0):
        """A torch tensor over the import (no copy); valid until release()."""
        if self._ptr is None:
            raise ValueError("the import was released")
        return _as_tensor(self, self._ptr, self._size, dtype, shape, offset)

    def release(self, stream=0):
        """Unmap after the work queued on `stream` is done."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None and self._client._cli:
            _check(_lib().gm_share_release(self._client._cli, _c.c_void_p(ptr),
                                           _c.c_void_p(_stream(stream))), "gm_share_release")


class _Part(Import):
    """Another range of a publish_many import: released with the first."""

    def __init__(self, first, ptr, size, read_only):
        super().__init__(first._client, ptr, size, read_only)
        self._first = first

    def release(self, stream=0):
        self._ptr = None


class Client(_Owned):
    """A connection to a share server (gm_share_connect)."""

    def __init__(self, path, device=None):
        self._cli = None
        self._pool = _pool(device)
        c = _c.c_void_p()
        _check(_lib().gm_share_connect(self._pool, _path(path), _c.byref(c)),
               "gm_share_connect(%s)" % (path,))
        self._cli = c

    def open(self, name, token=None):
        """Import `name`: an Import (a second open of a name is the same memory)."""
        p, n, acc = _c.c_void_p(), _c.c_size_t(), _c.c_int()
        _check(_lib().gm_share_import(self._cli, _name(name, "name"),
                                      None if token is None else _name(token, "token"),
                                      _c.byref(p), _c.byref(n), _c.byref(acc)),
               "gm_share_import(%s)" % name)
        return Import(self, p.value, n.value, acc.value == READ_ONLY)

    def open_many(self, name, token=None):
        """Import a name published with publish_many: a list of Imports, one
        per object, in order; release the first to release them all."""
        n = _c.c_size_t()
        lib = _lib()
        tok = None if token is None else _name(token, "token")
        st = lib.gm_share_import_ranges(self._cli, _name(name, "name"), tok, None, 0,
                                        _c.byref(n), None)
        if st == 0 or n.value == 0:
            _check(st or 1, "gm_share_import_ranges(%s)" % name)
        arr = (_Range * n.value)()
        acc = _c.c_int()
        _check(lib.gm_share_import_ranges(self._cli, _name(name, "name"), tok, arr, n.value,
                                          _c.byref(n), _c.byref(acc)),
               "gm_share_import_ranges(%s)" % name)
        ro = acc.value == READ_ONLY
        first = Import(self, arr[0].ptr, arr[0].size, ro)
        rest = [_Part(first, arr[i].ptr, arr[i].size, ro) for i in range(1, n.value)]
        return [first] + rest

    def close(self):
        cli, self._cli = self._cli, None
        if cli:
            _check(_lib().gm_share_disconnect(cli), "gm_share_disconnect")


def stats(device=None):
    """gm_share_stats of a device's pool, as a dict."""
    s = _Stats(_c.sizeof(_Stats), 1)
    _check(_lib().gm_share_stats(_pool(device), _c.byref(s)), "gm_share_stats")
    return {n: getattr(s, n) for n in _STAT_NAMES}

