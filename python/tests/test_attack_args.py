# SPDX-License-Identifier: Apache-2.0
"""Hostile arguments to every public function of the gpumem package.

Each public function checks its arguments before it calls the library:
TypeError for a wrong type (bool and float are not sizes, a str is not a
device), ValueError (gpumem.InvalidArgumentError, also a GpumemError named
GM_INVALID_ARGUMENT) for an out-of-range value (negative, above 2**63, a
memset past the end of its allocation, offset + size overflowing).  Without
these checks ctypes wraps such values silently: alloc(2**64 + 4096) became a
4 KiB block whose .size said 2**64 + 4096, memset overwrote the neighbouring
block, set_limit(-1) set the limit to SIZE_MAX.

Run from the repository root after `make` (ctest runs it with the other
python/tests):  GPUMEM_BACKEND=sim python3 -m unittest discover -s python/tests
"""
import ctypes
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("GPUMEM_BACKEND", "sim")
os.environ.setdefault("GPUMEM_SIM_CAPACITY", "4GiB")

import gpumem  # noqa: E402
import gpumem.cupy  # noqa: E402
import gpumem.torch  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
DEV = 20  # a pool of its own: these tests leave nothing in the others

NOT_SIZES = (True, False, 4096.0, 1.5, "4096", b"1", None, [4096], 4096j)
BAD_SIZES = (-1, -4096, 2**63 + 1, 2**64, 2**64 + 4096, 2**200)


def read_back(a, n):
    """n bytes of device memory at a.ptr, through gm_memcpy (sim: unified addressing)."""
    lib = gpumem._library()[0]
    buf = ctypes.create_string_buffer(n)
    pool = gpumem._pool(DEV)
    assert lib.gm_memcpy(pool, buf, ctypes.c_void_p(a.ptr), n, None) == 0
    assert lib.gm_stream_synchronize(pool, None) == 0
    return buf.raw


class ArgCase(unittest.TestCase):
    def assertValueError(self, fn, *args, **kw):
        with self.assertRaises(ValueError) as cm:
            fn(*args, **kw)
        self.assertNotIsInstance(cm.exception, MemoryError)  # not an 18 EB out-of-memory
        self.assertIsInstance(cm.exception, gpumem.GpumemError)
        self.assertEqual(cm.exception.name, "GM_INVALID_ARGUMENT")
        return cm.exception

    def tearDown(self):
        s = gpumem.stats(DEV)
        self.assertEqual(s["allocated"], 0, "a test left memory allocated")


class TestAllocArgs(ArgCase):
    def test_huge_size_does_not_wrap(self):
        # ctypes turned 2**64 + 4096 into 4096: a 4 KiB block claiming 2**64 + 4096 bytes
        err = self.assertValueError(gpumem.alloc, 2**64 + 4096, device=DEV)
        self.assertIn("2**63", str(err))

    def test_negative_size_is_not_out_of_memory(self):
        err = self.assertValueError(gpumem.alloc, -1, device=DEV)
        self.assertIn("-1", str(err))

    def test_bad_sizes(self):
        for size in BAD_SIZES:
            with self.subTest(size=size):
                self.assertValueError(gpumem.alloc, size, device=DEV)
                self.assertValueError(gpumem.Allocation, size, device=DEV)

    def test_sizes_of_the_wrong_type(self):
        for size in NOT_SIZES:
            with self.subTest(size=size):
                with self.assertRaises(TypeError):
                    gpumem.alloc(size, device=DEV)

    def test_streams(self):
        for stream in (-1, 2**64, 2**70):
            with self.subTest(stream=stream):
                self.assertValueError(gpumem.alloc, 4096, stream=stream, device=DEV)
        for stream in (True, 1.5, "0", b"\0"):
            with self.subTest(stream=stream):
                with self.assertRaises(TypeError):
                    gpumem.alloc(4096, stream=stream, device=DEV)
        with gpumem.alloc(4096, stream=None, device=DEV) as a:  # None: the default stream
            self.assertEqual(a.stream, 0)

    def test_devices(self):
        for device in (-1, -2**31, 2**31, 2**32, 2**64, 64):  # 2**32 used to wrap to device 0
            with self.subTest(device=device):
                self.assertValueError(gpumem.alloc, 4096, device=device)
        for device in (True, 0.0, "0", "cuda:0"):
            with self.subTest(device=device):
                with self.assertRaises(TypeError):
                    gpumem.alloc(4096, device=device)

    def test_largest_sizes_are_out_of_memory_not_wrapped(self):
        for size in (2**63, 2**63 - 1, 2**62):
            with self.subTest(size=size):
                with self.assertRaises(gpumem.OutOfMemoryError):
                    gpumem.alloc(size, device=DEV)

    def test_attributes_are_read_only(self):
        with gpumem.alloc(4096, device=DEV) as a:
            for name, value in (("size", 2**64), ("ptr", 12345), ("stream", 7), ("device", 3)):
                with self.subTest(attribute=name):
                    with self.assertRaises(AttributeError):
                        setattr(a, name, value)
            self.assertEqual(a.size, 4096)

    def test_one_owner_per_block(self):
        import copy
        import pickle
        with gpumem.alloc(4096, device=DEV) as a:
            for dup in (copy.copy, copy.deepcopy, pickle.dumps):
                with self.subTest(dup=dup):
                    with self.assertRaises(TypeError):  # the copy's free would free it twice
                        dup(a)
            with self.assertRaises(TypeError):
                a.__init__(8192, device=DEV)  # would lose the first block
            self.assertEqual(a.size, 4096)
            self.assertEqual(gpumem.stats(DEV)["allocated"], 4096)

    def test_int_like_values_are_accepted(self):
        class Index:  # what numpy integers look like to Python: __index__
            def __init__(self, v):
                self.v = v

            def __index__(self):
                return self.v
        with gpumem.alloc(Index(8192), stream=Index(0), device=Index(DEV)) as a:
            self.assertEqual(a.size, 8192)
            self.assertIs(type(a.size), int)
            a.memset(Index(7), Index(100), offset=Index(4))


class TestMemsetArgs(ArgCase):
    def test_memset_past_the_end_leaves_the_neighbour_alone(self):
        a = gpumem.alloc(4096, device=DEV)
        b = gpumem.alloc(4096, device=DEV)
        try:
            b.memset(0x11)
            first, second = sorted((a, b), key=lambda x: x.ptr)
            victim = b if first is a else a
            victim.memset(0x11)
            self.assertValueError(first.memset, 0x22, second.ptr - first.ptr + 4096)
            self.assertValueError(first.memset, 0x22, 4097)
            self.assertEqual(read_back(victim, 4096), b"\x11" * 4096)
        finally:
            a.free()
            b.free()

    def test_memset_ranges(self):
        with gpumem.alloc(4096, device=DEV) as a:
            a.memset(0x33)                         # the whole block
            a.memset(0x44, 96, offset=4000)        # the last 96 bytes
            a.memset(0x55, offset=4096)            # nothing, at the end
            a.memset(0x66, 0)
            self.assertEqual(read_back(a, 4096), b"\x33" * 4000 + b"\x44" * 96)
            for size, offset in ((4097, 0), (1, 4096), (97, 4000), (0, 4097), (2**64 - 1, 4096),
                                 (2**64 - 4000, 4000), (-1, 0), (16, -16), (2**64, 0)):
                with self.subTest(size=size, offset=offset):
                    self.assertValueError(a.memset, 0, size, offset=offset)
            for bad in (True, 1.0, "1"):
                with self.subTest(size=bad):
                    with self.assertRaises(TypeError):
                        a.memset(0, bad)
                with self.subTest(offset=bad):
                    with self.assertRaises(TypeError):
                        a.memset(0, 16, offset=bad)
            self.assertEqual(read_back(a, 4096), b"\x33" * 4000 + b"\x44" * 96)

    def test_memset_value_is_a_byte(self):
        with gpumem.alloc(4096, device=DEV) as a:
            a.memset(0x5A)
            for value in (256, -1, 2**32, 0x100 + 0x11):  # 0x111 used to write 0x11
                with self.subTest(value=value):
                    self.assertValueError(a.memset, value)
            for value in (True, 1.0, "a", b"a", None):
                with self.subTest(value=value):
                    with self.assertRaises(TypeError):
                        a.memset(value)
            self.assertEqual(read_back(a, 4096), b"\x5A" * 4096)
            a.memset(255)
            self.assertEqual(read_back(a, 16), b"\xff" * 16)

    def test_memset_after_free(self):
        a = gpumem.alloc(4096, device=DEV)
        a.free()
        with self.assertRaisesRegex(ValueError, "freed"):
            a.memset(0)

    def test_zero_size_allocation(self):
        with gpumem.alloc(0, device=DEV) as a:
            self.assertEqual(a.size, 0)
            a.memset(0)
            self.assertValueError(a.memset, 0, 1)


class TestPoolArgs(ArgCase):
    def test_set_limit(self):
        try:
            for limit in BAD_SIZES:
                with self.subTest(limit=limit):
                    self.assertValueError(gpumem.set_limit, limit, device=DEV)
            for limit in NOT_SIZES:
                with self.subTest(limit=limit):
                    with self.assertRaises(TypeError):
                        gpumem.set_limit(limit, device=DEV)
            # The limit was never changed: 64 MiB still fits (set_limit(-1) used to be SIZE_MAX,
            # set_limit(True) 1 byte).
            with gpumem.alloc(64 * MiB, device=DEV):
                pass
        finally:
            gpumem.set_limit(0, device=DEV)

    def test_trim(self):
        for keep in BAD_SIZES:
            with self.subTest(keep=keep):
                self.assertValueError(gpumem.trim, keep=keep, device=DEV)
        for keep in NOT_SIZES:
            with self.subTest(keep=keep):
                with self.assertRaises(TypeError):
                    gpumem.trim(keep, device=DEV)
        self.assertGreaterEqual(gpumem.trim(keep=2**63, device=DEV), 0)

    def test_device_arguments(self):
        for fn in (gpumem.stats, gpumem.reset_peaks, gpumem.leak_report,
                   lambda device: gpumem.trim(0, device=device),
                   lambda device: gpumem.set_limit(0, device=device),
                   lambda device: gpumem.forget_stream(0, device=device)):
            for device in (-1, 2**31, 2**32, 2**64):
                with self.subTest(fn=fn, device=device):
                    self.assertValueError(fn, device)
            for device in (True, 1.0, "1", b"1"):
                with self.subTest(fn=fn, device=device):
                    with self.assertRaises(TypeError):
                        fn(device)

    def test_forget_stream(self):
        for stream in (-1, 2**64):
            with self.subTest(stream=stream):
                self.assertValueError(gpumem.forget_stream, stream, device=DEV)
        for stream in (None, True, 0.0, "x", object()):
            with self.subTest(stream=stream):
                with self.assertRaises(TypeError):
                    gpumem.forget_stream(stream, device=DEV)

    def test_max_batch_size(self):
        calls = []
        for lo, hi in ((1.5, 4), (1, 4.0), (True, 4), (1, "4"), (None, 4)):
            with self.subTest(lo=lo, hi=hi):
                with self.assertRaises(TypeError):
                    gpumem.max_batch_size(calls.append, lo, hi, device=DEV)
        for lo, hi in ((0, 4), (-3, 4), (5, 4)):
            with self.subTest(lo=lo, hi=hi):
                self.assertValueError(gpumem.max_batch_size, calls.append, lo, hi, device=DEV)
        with self.assertRaises(TypeError):
            gpumem.max_batch_size("not callable", 1, 4, device=DEV)
        with self.assertRaises(TypeError):
            gpumem.max_batch_size(calls.append, 1, 4, device="0")
        self.assertEqual(calls, [], "step ran with a bad argument")


class TestAdapterArgs(ArgCase):
    def test_cupy_allocator_sizes(self):
        from test_gpumem import fake_cupy
        saved = sys.modules.get("cupy")
        cupy, rec = fake_cupy()
        cupy.cuda.runtime.getDevice = lambda: DEV
        sys.modules["cupy"] = cupy
        gpumem.cupy._state.update(enabled=False, previous=None)
        try:
            gpumem.cupy.enable()
            malloc = rec["allocator"]
            for size in BAD_SIZES:
                with self.subTest(size=size):
                    self.assertValueError(malloc, size)
            for size in (1.5, True, "1"):
                with self.subTest(size=size):
                    with self.assertRaises(TypeError):
                        malloc(size)
            p = malloc(4096)
            self.assertEqual(p.mem.size, 4096)
            del p
        finally:
            gpumem.cupy.disable()
            gpumem.cupy._state.update(enabled=False, previous=None)
            if saved is None:
                sys.modules.pop("cupy", None)
            else:
                sys.modules["cupy"] = saved

    def test_torch_memory_stats_devices(self):
        saved = sys.modules.get("torch")
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(current_device=lambda: DEV)
        sys.modules["torch"] = torch
        try:
            with gpumem.alloc(12345, device=DEV):
                for device in (None, DEV, "cuda:%d" % DEV, types.SimpleNamespace(type="cuda", index=DEV),
                               types.SimpleNamespace(type="cuda", index=None)):
                    with self.subTest(device=device):
                        self.assertEqual(gpumem.torch.memory_stats(device)["allocated"], 12345)
            for device in (-1, 2**32, "cuda:-1", "cuda:x"):
                with self.subTest(device=device):
                    self.assertValueError(gpumem.torch.memory_stats, device)
            for device in ("cpu", types.SimpleNamespace(type="cpu", index=None)):
                with self.subTest(device=device):
                    with self.assertRaises(ValueError):
                        gpumem.torch.memory_stats(device)
            for device in (True, 1.0, b"cuda"):
                with self.subTest(device=device):
                    with self.assertRaises(TypeError):
                        gpumem.torch.memory_stats(device)
        finally:
            if saved is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = saved

    def test_torch_drop_in_stats(self):
        # The drop-ins for torch.cuda's stats calls: same meanings, from the pool.
        saved = sys.modules.get("torch")
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(current_device=lambda: DEV)
        sys.modules["torch"] = torch
        gt = gpumem.torch
        try:
            import gc
            gc.collect()  # blocks of earlier tests, freed now rather than in the middle
            gt.reset_peak_memory_stats()
            base = gt.memory_allocated()
            self.assertEqual(gt.max_memory_allocated(), base)
            with gpumem.alloc(3 << 20, device=DEV), gpumem.alloc(1000, device=DEV):
                self.assertEqual(gt.memory_allocated(), base + (3 << 20) + 1000)
                peak = gt.max_memory_allocated()
                self.assertGreaterEqual(peak, base + (3 << 20) + 1000)
                self.assertEqual(gt.memory_allocated("cuda:%d" % DEV), gt.memory_allocated(DEV))
                self.assertGreaterEqual(gt.memory_reserved(), (3 << 20) + 1000)
                t = gt.torch_memory_stats()
                self.assertEqual(t["allocated_bytes.all.current"], base + (3 << 20) + 1000)
                self.assertGreaterEqual(t["allocation.all.current"], 2)
                self.assertEqual(t["reserved_bytes.all.current"], gt.memory_reserved())
            self.assertEqual(gt.memory_allocated(), base)
            self.assertEqual(gt.max_memory_allocated(), peak)  # a free moves no peak
            self.assertGreaterEqual(gt.max_memory_reserved(), gt.memory_reserved())
            gt.reset_peak_memory_stats(DEV)
            self.assertEqual(gt.max_memory_allocated(), base)
            for f in (gt.memory_allocated, gt.max_memory_allocated, gt.memory_reserved,
                      gt.max_memory_reserved, gt.reset_peak_memory_stats, gt.torch_memory_stats):
                with self.subTest(f=f.__name__):
                    with self.assertRaises(ValueError):
                        f("cpu")
                    with self.assertRaises(TypeError):
                        f(1.5)
        finally:
            if saved is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = saved


if __name__ == "__main__":
    unittest.main()
