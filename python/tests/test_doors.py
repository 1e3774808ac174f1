# SPDX-License-Identifier: Apache-2.0
"""Tests of gpumem.vllm and gpumem.tms (the sleep doors) on the sim backend.

Run as test_gpumem.py is (ctest python/unittest).  PyTorch is played by a
small fake `torch` module that names the current device and stream, with
gpumem.torch taken as enabled, so the doors' allocations are raw
gpumem.alloc blocks made inside their scopes; bytes are written and read
back with gm_memcpy (the sim has unified addressing).
"""
import ctypes
import os
import random
import shutil
import sys
import tempfile
import threading
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("GPUMEM_BACKEND", "sim")
os.environ.setdefault("GPUMEM_SIM_CAPACITY", "4GiB")

import gpumem  # noqa: E402
import gpumem.torch  # noqa: E402
import gpumem.tms as tms  # noqa: E402
from gpumem.vllm import CuMemAllocator, SleepStateError  # noqa: E402

MiB = 1 << 20
HAVE_TAGS = hasattr(gpumem._library()[0], "gm_offload")


def lib():
    return gpumem._library()[0]


def read_device(dev, ptr, n):
    buf = ctypes.create_string_buffer(n)
    pool = gpumem._pool(dev)
    assert lib().gm_memcpy(pool, buf, ctypes.c_void_p(ptr), n, None) == 0
    assert lib().gm_stream_synchronize(pool, None) == 0
    return buf.raw


def write_device(dev, ptr, data):
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    pool = gpumem._pool(dev)
    assert lib().gm_memcpy(pool, ctypes.c_void_p(ptr), buf, len(data), None) == 0
    assert lib().gm_stream_synchronize(pool, None) == 0


def copies(dev):
    """The backend's memcpy calls of the pool so far."""
    return gpumem.stats(dev)["backend_calls"]["memcpy"]


def fail_nth(dev, kind, n):
    """gm_sim_fail_nth: the n-th next backend call of `kind` fails (0 disarms)."""
    fn = lib().gm_sim_fail_nth
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_ulong]
    name = lib().gm_call_from_name
    name.restype, name.argtypes = ctypes.c_int, [ctypes.c_char_p]
    assert fn(gpumem._pool(dev), name(kind.encode()), n) == 0


class FakeTorch:
    """sys.modules['torch'] with CUDA initialized on `device`, stream 0, and
    gpumem.torch taken as enabled; restored by stop()."""

    def __init__(self, device):
        self.device = device
        self.torch = types.ModuleType("torch")
        self.torch.cuda = types.SimpleNamespace(
            is_available=lambda: True, is_initialized=lambda: True,
            current_device=lambda: self.device,
            current_stream=lambda device=None: types.SimpleNamespace(cuda_stream=0))
        self.saved = sys.modules.get("torch")
        self.patch = mock.patch.object(gpumem.torch, "is_enabled", lambda: True)

    def start(self):
        sys.modules["torch"] = self.torch
        self.patch.start()
        return self

    def stop(self):
        self.patch.stop()
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved


class DoorCase(unittest.TestCase):
    DEV = 20

    def setUp(self):
        self.fake = FakeTorch(self.DEV).start()
        self.blocks = []
        CuMemAllocator.instance = None        # a fresh allocator per test
        self.registry = mock.patch.object(tms, "_registry", tms._Registry())
        self.registry.start()

    def tearDown(self):
        for a in self.blocks:
            a.free()
        self.registry.stop()
        CuMemAllocator.instance = None
        self.fake.stop()
        for dev in {self.DEV, self.DEV + 1}:
            self.assertEqual(gpumem.stats(dev)["allocated"], 0, "a test left memory allocated")
            gpumem.trim(device=dev)

    def alloc(self, size, fill=None):
        a = gpumem.alloc(size)
        self.blocks.append(a)
        if fill is not None:
            a.memset(fill)
        return a

    def filled(self, a, value):
        return read_device(self.DEV, a.ptr, a.size) == bytes([value]) * a.size


@unittest.skipUnless(HAVE_TAGS, "this libgpumem.so has no tags, offload or restore yet")
class TestVllmDoor(DoorCase):
    DEV = 20

    def test_singleton(self):
        a = CuMemAllocator.get_instance()
        self.assertIs(CuMemAllocator.get_instance(), a)
        self.assertIs(CuMemAllocator.instance, a)
        with self.assertRaisesRegex(SleepStateError, "get_instance"):
            CuMemAllocator()
        self.assertEqual(CuMemAllocator.default_tag, "default")
        self.assertFalse(a.is_sleeping)
        self.assertEqual(a.get_current_usage(), 0)

    def _model(self, alloc):
        with alloc.use_memory_pool(tag="weights"):
            w = [self.alloc(4 * MiB, 0x11), self.alloc(6 * MiB + 123, 0x22), self.alloc(1000, 0x33)]
        with alloc.use_memory_pool(tag="kv_cache"):
            kv = [self.alloc(8 * MiB, 0x44)]
        return w, kv

    def test_level1_keeps_weights_and_gives_every_page_back(self):
        alloc = CuMemAllocator.get_instance()
        w, kv = self._model(alloc)
        total = sum(a.size for a in w + kv)
        ptrs = [a.ptr for a in w + kv]
        self.assertEqual(alloc.get_current_usage(), total)
        self.assertGreaterEqual(gpumem.stats(self.DEV)["reserved"], total)
        copied0 = gpumem.stats(self.DEV)["offload_bytes_total"]
        alloc.sleep(level=1)
        s = gpumem.stats(self.DEV)
        self.assertEqual(s["reserved"], 0)             # every page went back
        self.assertEqual(s["active"], 0)
        self.assertEqual(s["offload_bytes_total"] - copied0, sum(a.size for a in w))  # kv: no copy
        self.assertTrue(alloc.is_sleeping)
        self.assertEqual(alloc.sleeping_tags, {"weights", "kv_cache"})
        info = alloc.tag_info("weights")
        self.assertEqual((info["resident_bytes"], info["offloaded_bytes"], info["asleep"], info["kept"]),
                         (0, sum(a.size for a in w), True, True))
        self.assertFalse(alloc.tag_info("kv_cache")["kept"])
        self.assertEqual(gpumem.tag_info("vllm/weights", self.DEV)["offloaded_blocks"], 3)
        self.assertEqual(alloc.get_current_usage(), total)  # asleep memory stays allocated

        alloc.wake_up(tags=["weights"])
        self.assertEqual([a.ptr for a in w + kv], ptrs)
        for a, v in zip(w, (0x11, 0x22, 0x33)):
            self.assertTrue(self.filled(a, v))
        self.assertTrue(alloc.is_sleeping)
        self.assertEqual(alloc.sleeping_tags, {"kv_cache"})
        self.assertEqual(alloc.tag_info("kv_cache")["resident_bytes"], 0)
        alloc.wake_up(tags=["kv_cache"])
        self.assertFalse(alloc.is_sleeping)
        self.assertEqual(alloc.tag_info("kv_cache")["resident_bytes"], 8 * MiB)
        kv[0].memset(0x55)                              # fresh pages, usable
        self.assertTrue(self.filled(kv[0], 0x55))
        self.assertEqual(gpumem.stats(self.DEV)["offloaded"], 0)

    def test_prepare_sleep(self):
        alloc = CuMemAllocator.get_instance()
        w, kv = self._model(alloc)
        host0 = gpumem.stats(self.DEV)["host_reserved"]
        alloc.prepare_sleep(offload_tags=("weights",), background=False)
        host1 = gpumem.stats(self.DEV)["host_reserved"]
        self.assertGreaterEqual(host1, sum(a.size for a in w))
        self.assertGreater(host1, host0)
        alloc.prepare_sleep(offload_tags="weights")     # again, on a thread: nothing new needed
        with self.assertRaises(TypeError):
            alloc.prepare_sleep(background="yes")
        alloc.sleep(level=1)                            # waits for the preparation
        self.assertEqual(gpumem.stats(self.DEV)["host_reserved"], host1)
        alloc.wake_up()
        for a, v in zip(w, (0x11, 0x22, 0x33)):
            self.assertTrue(self.filled(a, v))

    def test_level2_copies_nothing(self):
        alloc = CuMemAllocator.get_instance()
        w, kv = self._model(alloc)
        copied0 = gpumem.stats(self.DEV)["offload_bytes_total"]
        alloc.sleep(level=2)
        self.assertEqual(gpumem.stats(self.DEV)["offload_bytes_total"], copied0)
        self.assertEqual(gpumem.stats(self.DEV)["reserved"], 0)
        self.assertFalse(alloc.tag_info("weights")["kept"])
        alloc.wake_up()
        self.assertFalse(alloc.is_sleeping)
        self.assertEqual(gpumem.stats(self.DEV)["offloaded"], 0)
        for a in w + kv:                                # rebuilt by the caller, as in vLLM
            a.memset(0x66)
            self.assertTrue(self.filled(a, 0x66))

    def test_offload_tags_forms(self):
        alloc = CuMemAllocator.get_instance()
        with alloc.use_memory_pool():                   # None: the default tag
            d = self.alloc(3 * MiB, 0x01)
        with alloc.use_memory_pool(tag="weights"):
            w = self.alloc(2 * MiB, 0x02)
        self.assertEqual(gpumem.tag_info("vllm/default", self.DEV)["resident_bytes"], 3 * MiB)
        for keep, kept in ((None, d), ("weights", w), (("weights",), w), (["default"], d)):
            with self.subTest(offload_tags=keep):
                copied0 = gpumem.stats(self.DEV)["offload_bytes_total"]
                alloc.sleep(offload_tags=keep)
                self.assertEqual(gpumem.stats(self.DEV)["offload_bytes_total"] - copied0, kept.size)
                alloc.wake_up()
                self.assertTrue(self.filled(kept, kept.ptr and (0x01 if kept is d else 0x02)))
                other = w if kept is d else d
                other.memset(0x01 if other is d else 0x02)  # the discarded one, rebuilt
        alloc.sleep(offload_tags=())                    # an empty tuple keeps nothing
        alloc.wake_up(("default", "weights"))
        alloc.sleep(offload_tags=("never-used",))       # an unknown name keeps nothing, as in vLLM
        alloc.wake_up("weights")                        # a str is one tag
        alloc.wake_up()
        self.assertFalse(alloc.is_sleeping)

    def test_misuse_raises_and_changes_nothing(self):
        alloc = CuMemAllocator.get_instance()
        with alloc.use_memory_pool(tag="weights"):
            w = self.alloc(MiB, 0x7E)
        with self.assertRaisesRegex(SleepStateError, "not asleep"):
            alloc.wake_up()
        alloc.sleep(level=1)
        with self.assertRaisesRegex(SleepStateError, "asleep already") as cm:
            alloc.sleep(level=1)
        self.assertEqual(cm.exception.name, "GM_INVALID_STATE")
        self.assertIsInstance(cm.exception, gpumem.GpumemError)
        with self.assertRaisesRegex(gpumem.InvalidArgumentError, "no memory was ever"):
            alloc.wake_up(tags=["kv_cache"])
        self.assertEqual(alloc.sleeping_tags, {"weights"})  # nothing woken by the failed call
        alloc.wake_up(tags=["weights"])
        with self.assertRaisesRegex(SleepStateError, "not asleep"):
            alloc.wake_up(tags=["weights"])
        self.assertTrue(self.filled(w, 0x7E))
        for bad, err in (({"level": 3}, gpumem.InvalidArgumentError), ({"level": True}, gpumem.InvalidArgumentError),
                         ({"level": 1, "offload_tags": ()}, gpumem.InvalidArgumentError),
                         ({"offload_tags": 5}, TypeError), ({"offload_tags": (5,)}, TypeError),
                         ({"offload_tags": ("",)}, gpumem.InvalidArgumentError)):
            with self.subTest(**{k: repr(v) for k, v in bad.items()}):
                with self.assertRaises(err):
                    alloc.sleep(**bad)
                self.assertFalse(alloc.is_sleeping)
        with self.assertRaises(TypeError):
            with alloc.use_memory_pool(tag=5):
                pass
        with self.assertRaises(gpumem.InvalidArgumentError):
            with alloc.use_memory_pool(tag="x" * 59):   # 63 bytes with "vllm/"
                pass
        with alloc.use_memory_pool(tag="x" * 58):
            pass
        with self.assertRaises(gpumem.InvalidArgumentError):
            alloc.tag_info("nope")

    def test_wake_after_free(self):
        alloc = CuMemAllocator.get_instance()
        with alloc.use_memory_pool(tag="weights"):
            a = self.alloc(5 * MiB, 0x12)
            b = self.alloc(300000, 0x13)
        alloc.sleep(offload_tags=("weights",))
        a.free()                                        # freed while asleep: its host copy goes
        self.assertEqual(gpumem.stats(self.DEV)["offloaded"], b.size)
        alloc.wake_up()
        self.assertTrue(self.filled(b, 0x13))
        b.free()
        self.assertEqual(alloc.get_current_usage(), 0)
        alloc.sleep()                                   # nothing left: sleeps and wakes all the same
        alloc.wake_up()
        self.assertEqual(gpumem.stats(self.DEV)["offloaded"], 0)

    def test_wake_is_all_or_nothing(self):
        alloc = CuMemAllocator.get_instance()
        with alloc.use_memory_pool(tag="a"):
            a = self.alloc(8 * MiB, 0xA1)
        with alloc.use_memory_pool(tag="b"):
            b = self.alloc(8 * MiB, 0xB2)
        alloc.sleep(offload_tags=("a", "b"))
        gpumem.set_limit(12 * MiB, device=self.DEV)     # room for one tag, not two
        try:
            with self.assertRaises(gpumem.OutOfMemoryError):
                alloc.wake_up()
            self.assertEqual(alloc.sleeping_tags, {"a", "b"})   # "a" went back to sleep
            self.assertEqual(alloc.tag_info("a")["resident_bytes"], 0)
            self.assertEqual(gpumem.stats(self.DEV)["active"], 0)
            alloc.wake_up(["a"])                        # one fits
            with self.assertRaises(gpumem.OutOfMemoryError):
                alloc.wake_up(["b"])
            self.assertEqual(alloc.sleeping_tags, {"b"})
        finally:
            gpumem.set_limit(0, device=self.DEV)
        alloc.wake_up(["b"])
        self.assertTrue(self.filled(a, 0xA1))
        self.assertTrue(self.filled(b, 0xB2))
        self.assertFalse(alloc.is_sleeping)

    def test_failed_copy_wakes_what_the_sleep_took(self):
        alloc = CuMemAllocator.get_instance()
        with alloc.use_memory_pool(tag="a"):
            a = self.alloc(8 * MiB, 0xC1)
        with alloc.use_memory_pool(tag="b"):
            b = self.alloc(8 * MiB + 5, 0xC2)
        # the copies of "a" alone, counted; then the first copy of "b" fails
        before = copies(self.DEV)
        alloc.sleep(offload_tags=("a",))
        n = copies(self.DEV) - before
        self.assertGreater(n, 0)
        alloc.wake_up()
        b.memset(0xC2)
        fail_nth(self.DEV, "memcpy", n + 1)
        try:
            with self.assertRaises(gpumem.GpumemError) as cm:
                alloc.sleep(offload_tags=("a", "b"))
        finally:
            fail_nth(self.DEV, "memcpy", 0)
        self.assertEqual(cm.exception.name, "GM_BACKEND")
        self.assertFalse(alloc.is_sleeping)
        for t, blk, v in (("a", a, 0xC1), ("b", b, 0xC2)):
            self.assertEqual(alloc.tag_info(t)["resident_bytes"], blk.size)
            self.assertTrue(self.filled(blk, v))
        alloc.sleep(offload_tags=("a", "b"))
        alloc.wake_up()
        self.assertTrue(self.filled(a, 0xC1) and self.filled(b, 0xC2))

    def test_scopes_are_per_thread_and_sleep_is_one_at_a_time(self):
        alloc = CuMemAllocator.get_instance()
        inside, done = threading.Event(), threading.Event()
        out = {}

        def tagged():
            with alloc.use_memory_pool(tag="weights"):
                out["w"] = gpumem.alloc(2 * MiB)
                inside.set()
                done.wait(30)
        th = threading.Thread(target=tagged)
        th.start()
        try:
            self.assertTrue(inside.wait(30))
            u = self.alloc(MiB, 0x5C)                   # this thread is not in the scope
            self.assertEqual(alloc.get_current_usage(), 2 * MiB)
        finally:
            done.set()
            th.join()
        self.blocks.append(out["w"])
        out["w"].memset(0x5D)
        results = []
        barrier = threading.Barrier(4)

        def call(fn):
            barrier.wait(30)
            try:
                fn()
                results.append("ok")
            except SleepStateError:
                results.append("state")
        for fn in (lambda: alloc.sleep(offload_tags=("weights",)), alloc.wake_up):
            results.clear()
            threads = [threading.Thread(target=call, args=(fn,)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(sorted(results), ["ok", "state", "state", "state"])
        self.assertTrue(self.filled(out["w"], 0x5D))
        self.assertTrue(self.filled(u, 0x5C))
        self.assertEqual(gpumem.stats(self.DEV)["allocated"], 3 * MiB)

    def test_tag_used_on_two_devices(self):
        alloc = CuMemAllocator.get_instance()
        with alloc.use_memory_pool(tag="weights"):
            a = self.alloc(4 * MiB, 0x21)
            self.fake.device = self.DEV + 1             # torch.cuda.set_device inside the scope
            b = gpumem.alloc(4 * MiB)
            self.blocks.append(b)
            b.memset(0x22)
        self.fake.device = self.DEV
        alloc.sleep(level=1)
        self.assertEqual(gpumem.stats(self.DEV)["reserved"], 0)
        self.assertEqual(gpumem.stats(self.DEV + 1)["reserved"], 0)
        self.assertEqual(alloc.tag_info("weights")["offloaded_blocks"], 2)
        alloc.wake_up()
        self.assertTrue(self.filled(a, 0x21))
        self.assertEqual(read_device(self.DEV + 1, b.ptr, b.size), b"\x22" * b.size)

    def test_pytorch_must_be_routed(self):
        alloc = CuMemAllocator.get_instance()
        self.fake.patch.stop()                          # gpumem.torch not enabled
        try:
            def too_late():
                raise gpumem.torch.TorchError("CUDA is initialized")
            with mock.patch.object(gpumem.torch, "enable", too_late):
                with self.assertRaisesRegex(gpumem.GpumemError, r"gpumem.torch.enable\(\)"):
                    with alloc.use_memory_pool(tag="weights"):
                        pass
                self.fake.torch.cuda.is_available = lambda: False   # no CUDA: nothing to route
                with alloc.use_memory_pool(tag="weights"):
                    pass
            calls = []
            self.fake.torch.cuda.is_available = lambda: True
            with mock.patch.object(gpumem.torch, "enable", lambda: calls.append(1)):
                with alloc.use_memory_pool(tag="weights"):  # early enough: enabled on the way in
                    pass
            self.assertEqual(calls, [1])
        finally:
            self.fake.patch.start()


@unittest.skipUnless(HAVE_TAGS, "this libgpumem.so has no tags, offload or restore yet")
class TestTmsDoor(DoorCase):
    DEV = 22

    def test_module_shape(self):
        saver = tms.torch_memory_saver
        self.assertIsInstance(saver, tms.TorchMemorySaver)
        self.assertTrue(saver.enabled)
        with tms.configure_subprocess():
            pass
        saver.hook_mode = "torch"
        saver.hook_mode = "preload"
        with self.assertRaises(ValueError):
            saver.hook_mode = "other"
        saver.memory_margin_bytes = 1 << 30
        saver.retain_cpu_backup = True
        self.assertTrue(saver.retain_cpu_backup)
        with self.assertRaises(NotImplementedError):
            saver.get_cpu_backup(None)
        with self.assertRaises(NotImplementedError):
            saver.set_disk_backup_dir("/tmp")

    def test_shim_module(self):
        """docs/sleep.md's one-line torch_memory_saver.py gives what SGLang uses."""
        d = tempfile.mkdtemp()
        try:
            with open(os.path.join(d, "torch_memory_saver.py"), "w") as f:
                f.write("from gpumem.tms import *\n")
            sys.path.insert(0, d)
            saved = sys.modules.pop("torch_memory_saver", None)
            try:
                import torch_memory_saver as shim
                from torch_memory_saver import torch_memory_saver as saver
            finally:
                sys.path.remove(d)
                sys.modules.pop("torch_memory_saver", None)
                if saved is not None:
                    sys.modules["torch_memory_saver"] = saved
            self.assertIs(saver, tms.torch_memory_saver)
            self.assertIs(shim.configure_subprocess, tms.configure_subprocess)
            self.assertIs(shim.TorchMemorySaver, tms.TorchMemorySaver)
        finally:
            shutil.rmtree(d)

    def test_backup_kept_default_discarded(self):
        saver = tms.TorchMemorySaver()
        with saver.region(tag="weights", enable_cpu_backup=True):
            w = [self.alloc(5 * MiB + 7, 0x31), self.alloc(4096, 0x32)]
        with saver.region():                            # tag "default", no backup: discarded
            kv = self.alloc(6 * MiB, 0x33)
        ptrs = [a.ptr for a in w + [kv]]
        copied0 = gpumem.stats(self.DEV)["offload_bytes_total"]
        saver.pause()
        s = gpumem.stats(self.DEV)
        self.assertEqual(s["active"], 0)
        self.assertEqual(s["offload_bytes_total"] - copied0, sum(a.size for a in w))
        gpumem.trim(device=self.DEV)
        self.assertEqual(gpumem.stats(self.DEV)["reserved"], 0)   # every page went back
        self.assertTrue(saver.is_paused("weights") and saver.is_paused("default"))
        self.assertEqual(gpumem.tag_info("tms.drop/default", self.DEV)["discard"], True)
        saver.resume()
        self.assertEqual([a.ptr for a in w + [kv]], ptrs)
        self.assertTrue(self.filled(w[0], 0x31) and self.filled(w[1], 0x32))
        self.assertFalse(saver.is_paused("weights"))
        kv.memset(0x34)
        self.assertTrue(self.filled(kv, 0x34))

    def test_prepare_pause(self):
        saver = tms.TorchMemorySaver()
        with saver.region(tag="p", enable_cpu_backup=True):
            k = self.alloc(5 * MiB, 0x61)
        host0 = gpumem.stats(self.DEV)["host_reserved"]
        saver.prepare_pause("p", background=False)
        saver.prepare_pause()                           # every tag, on a thread
        saver.prepare_pause("never-used")               # nothing to do
        host1 = gpumem.stats(self.DEV)["host_reserved"]
        self.assertGreaterEqual(host1, 5 * MiB)
        self.assertGreaterEqual(host1, host0)
        saver.pause("p")
        self.assertEqual(gpumem.stats(self.DEV)["host_reserved"], host1)  # it found its memory
        saver.resume("p")
        self.assertTrue(self.filled(k, 0x61))

    def test_one_tag_both_kinds(self):
        saver = tms.TorchMemorySaver()
        with saver.region(tag="t", enable_cpu_backup=True, cpu_backup_backend="mmap"):
            k = self.alloc(3 * MiB, 0x41)
        with saver.region(tag="t", enable_cpu_backup=False):
            d = self.alloc(3 * MiB, 0x42)
        info = saver.tag_info("t")
        self.assertEqual(info["gpumem_tags"], ["tms.keep/t", "tms.drop/t"])
        self.assertEqual(info["resident_bytes"], 6 * MiB)
        copied0 = gpumem.stats(self.DEV)["offload_bytes_total"]
        saver.pause("t")
        self.assertEqual(gpumem.stats(self.DEV)["offload_bytes_total"] - copied0, k.size)
        self.assertEqual(saver.tag_info("t")["offloaded_bytes"], 6 * MiB)
        saver.resume("t")
        self.assertTrue(self.filled(k, 0x41))
        d.memset(0)

    def test_per_tag_and_misuse(self):
        saver = tms.TorchMemorySaver()
        with saver.region(tag="a", enable_cpu_backup=True):
            a = self.alloc(2 * MiB, 0x51)
        with saver.region(tag="b", enable_cpu_backup=True):
            b = self.alloc(2 * MiB, 0x52)
        saver.pause("a")
        self.assertEqual(saver.tag_info("b")["resident_bytes"], 2 * MiB)
        with self.assertRaisesRegex(tms.SleepStateError, "paused already"):
            saver.pause("a")
        with self.assertRaisesRegex(tms.SleepStateError, "not paused"):
            saver.resume("b")
        saver.pause("never-used")                       # as torch_memory_saver: nothing to do
        saver.resume("never-used")
        saver.pause()                                   # the rest: "b"
        with self.assertRaisesRegex(tms.SleepStateError, "every tag is paused"):
            saver.pause()
        saver.resume("b")
        self.assertTrue(self.filled(b, 0x52))
        saver.resume()                                  # the rest: "a"
        with self.assertRaisesRegex(tms.SleepStateError, "no tag is paused"):
            saver.resume()
        self.assertTrue(self.filled(a, 0x51))
        for kwargs, err in (({"enable_disk_backup": True}, NotImplementedError),
                            ({"enable_cpu_backup": True, "enable_disk_backup": True}, ValueError),
                            ({"cpu_backup_backend": "pinned"}, ValueError),
                            ({"enable_cpu_backup": True, "cpu_backup_backend": "disk"}, ValueError),
                            ({"enable_cpu_backup": 1}, TypeError), ({"tag": None}, TypeError),
                            ({"tag": "x" * 55}, gpumem.InvalidArgumentError)):
            with self.subTest(**{k: repr(v) for k, v in kwargs.items()}):
                with self.assertRaises(err):
                    with saver.region(**kwargs):
                        pass
        with self.assertRaises(TypeError):
            saver.pause(5)
        with self.assertRaises(gpumem.InvalidArgumentError):
            saver.tag_info("never-used")

    def test_state_is_the_process(self):
        one, two = tms.TorchMemorySaver(), tms.TorchMemorySaver()
        with one.region(tag="s", enable_cpu_backup=True):
            a = self.alloc(MiB, 0x61)
        two.pause("s")
        self.assertTrue(one.is_paused("s"))
        with self.assertRaises(tms.SleepStateError):
            one.pause("s")
        one.resume("s")
        self.assertTrue(self.filled(a, 0x61))

    def test_disable_and_nesting(self):
        saver = tms.TorchMemorySaver()
        with saver.region(tag="outer"):
            o1 = self.alloc(MiB, 0x71)
            with saver.region(tag="inner", enable_cpu_backup=True):
                i = self.alloc(MiB, 0x72)
                with saver.disable():
                    u = self.alloc(MiB, 0x73)             # no tag: never paused
            o2 = self.alloc(MiB, 0x74)                    # the outer tag is back
        self.assertEqual(saver.tag_info("outer")["resident_blocks"], 2)
        self.assertEqual(saver.tag_info("inner")["resident_blocks"], 1)
        saver.pause()
        self.assertEqual(gpumem.stats(self.DEV)["active"], u.size)
        self.assertTrue(self.filled(u, 0x73))
        saver.resume()
        self.assertTrue(self.filled(i, 0x72))
        for a in (o1, o2):
            a.memset(0)

    def test_resume_is_all_or_nothing_and_region_while_paused(self):
        saver = tms.TorchMemorySaver()
        with saver.region(tag="k", enable_cpu_backup=True):
            k = self.alloc(8 * MiB, 0x81)
        with saver.region(tag="d"):
            d = self.alloc(8 * MiB, 0x82)
        saver.pause()
        with saver.region(tag="k", enable_cpu_backup=True):
            late = self.alloc(MiB, 0x83)                  # into a paused tag: resident as usual
        gpumem.trim(device=self.DEV)
        gpumem.set_limit(14 * MiB, device=self.DEV)
        try:
            with self.assertRaises(gpumem.OutOfMemoryError):
                saver.resume()                            # "k" fits, then "d" does not
            self.assertTrue(saver.is_paused("k") and saver.is_paused("d"))
            # "k" went back to sleep, the block made while it was paused with it
            self.assertEqual(saver.tag_info("k")["resident_bytes"], 0)
            self.assertEqual(gpumem.stats(self.DEV)["active"], 0)
        finally:
            gpumem.set_limit(0, device=self.DEV)
        saver.resume()
        self.assertTrue(self.filled(k, 0x81))
        self.assertTrue(self.filled(late, 0x83))
        d.memset(0)

    def test_failed_copy_resumes_what_the_pause_took(self):
        saver = tms.TorchMemorySaver()
        with saver.region(tag="a", enable_cpu_backup=True):
            a = self.alloc(6 * MiB, 0xD1)
        with saver.region(tag="b", enable_cpu_backup=True):
            b = self.alloc(6 * MiB + 9, 0xD2)
        with saver.region(tag="b"):
            d = self.alloc(2 * MiB, 0xD3)                 # "b"'s discarded part: not touched
        before = copies(self.DEV)
        saver.pause("a")
        n = copies(self.DEV) - before
        saver.resume("a")
        fail_nth(self.DEV, "memcpy", n + 1)               # the first copy of "b" fails
        try:
            with self.assertRaises(gpumem.GpumemError) as cm:
                saver.pause()
        finally:
            fail_nth(self.DEV, "memcpy", 0)
        self.assertEqual(cm.exception.name, "GM_BACKEND")
        self.assertFalse(saver.is_paused("a") or saver.is_paused("b"))
        self.assertEqual(gpumem.stats(self.DEV)["offloaded"], 0)
        for blk, v in ((a, 0xD1), (b, 0xD2), (d, 0xD3)):
            self.assertTrue(self.filled(blk, v))
        saver.pause()
        saver.resume()
        self.assertTrue(self.filled(a, 0xD1) and self.filled(b, 0xD2))

    def test_threads(self):
        saver = tms.TorchMemorySaver()
        errors = []
        ready = threading.Barrier(4)
        blocks = {}

        def worker(i):
            try:
                with saver.region(tag="t%d" % i, enable_cpu_backup=True):
                    ready.wait(30)
                    a = gpumem.alloc((i + 1) * MiB)
                    a.memset(0x90 + i)
                blocks[i] = a
                for _ in range(10):
                    saver.pause("t%d" % i)
                    saver.resume("t%d" % i)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.blocks.extend(blocks.values())
        self.assertEqual(errors, [])
        for i, a in blocks.items():
            self.assertEqual(saver.tag_info("t%d" % i)["resident_bytes"], (i + 1) * MiB)
            self.assertTrue(self.filled(a, 0x90 + i))


@unittest.skipUnless(HAVE_TAGS, "this libgpumem.so has no tags, offload or restore yet")
class TestDoorTorture(DoorCase):
    """Random tags, sizes, writes, frees and discards through both doors,
    every kept byte checked after every wake."""
    DEV = 23
    CYCLES = int(os.environ.get("GPUMEM_DOOR_CYCLES", "300"))

    def _size(self, rng):
        r = rng.random()
        if r < 0.6:
            return rng.randint(1, 64 << 10)
        if r < 0.9:
            return rng.randint(64 << 10, 1 << 20)
        return rng.randint(1 << 20, 3 * MiB)

    def _check(self, live, what):
        for a, shadow in live:
            got = read_device(self.DEV, a.ptr, a.size)
            if got != bytes(shadow):
                bad = next(i for i in range(a.size) if got[i] != shadow[i])
                self.fail("%s: block %#x (%d bytes) differs at offset %d: %#x, want %#x"
                          % (what, a.ptr, a.size, bad, got[bad], shadow[bad]))

    def _write(self, rng, a, shadow):
        if rng.random() < 0.3:
            v = rng.randrange(256)
            a.memset(v)
            shadow[:] = bytes([v]) * a.size
        n = rng.randint(1, min(a.size, 4096))
        off = rng.randint(0, a.size - n)
        data = rng.getrandbits(8 * n).to_bytes(n, "little")
        write_device(self.DEV, a.ptr + off, data)
        shadow[off:off + n] = data

    def _run(self, door):
        rng = random.Random(int(os.environ.get("GPUMEM_DOOR_SEED", "4404")) + (door == "tms"))
        names = ["weights", "kv_cache", "default", "lora"]
        live = {n: [] for n in names}                     # tag -> [(Allocation, bytearray)]
        backup = {}                                       # tms: (tag, kept) per block
        alloc = CuMemAllocator.get_instance()
        saver = tms.TorchMemorySaver()
        for cycle in range(self.CYCLES):
            # allocate, write and free a little in random tags
            for _ in range(rng.randint(0, 3)):
                n = rng.choice(names)
                kept = rng.random() < 0.6
                scope = (alloc.use_memory_pool(tag=n) if door == "vllm"
                         else saver.region(tag=n, enable_cpu_backup=kept))
                with scope:
                    a = gpumem.alloc(self._size(rng))
                shadow = bytearray(a.size)
                a.memset(0)
                live[n].append((a, shadow))
                backup[a.ptr] = kept
                self._write(rng, a, shadow)
            for n in names:
                for a, shadow in list(live[n]):
                    r = rng.random()
                    if r < 0.08:
                        live[n].remove((a, shadow))
                        a.free()
                    elif r < 0.4:
                        self._write(rng, a, shadow)
            # sleep: a random set kept; the rest discarded
            if door == "vllm":
                keep = [n for n in names if rng.random() < 0.6]
                alloc.sleep(offload_tags=tuple(keep))
                self.assertEqual(gpumem.stats(self.DEV)["reserved"], 0, "cycle %d" % cycle)
                paused = names
            else:
                paused = [n for n in names if rng.random() < 0.7]
                if rng.random() < 0.3:
                    saver.pause()
                    paused = [n for n in names if saver.is_paused(n)]
                else:
                    for n in paused:
                        saver.pause(n)
                active = gpumem.stats(self.DEV)["active"]
                want = sum(((a.size + 255) // 256) * 256 for n in names if n not in paused
                           for a, _ in live[n])
                self.assertLessEqual(active, want, "cycle %d" % cycle)

            def discarded(n, a):
                if door == "vllm":
                    return n not in keep
                return n in paused and not backup[a.ptr]
            lost = {a.ptr for n in names for a, _ in live[n] if discarded(n, a)}
            # while asleep: frees, and allocations into sleeping tags (resident as usual)
            for n in names:
                for a, shadow in list(live[n]):
                    if rng.random() < 0.05:
                        live[n].remove((a, shadow))
                        lost.discard(a.ptr)
                        a.free()
            if rng.random() < 0.3:
                n = rng.choice(names)
                kept = rng.random() < 0.5
                scope = (alloc.use_memory_pool(tag=n) if door == "vllm"
                         else saver.region(tag=n, enable_cpu_backup=kept))
                with scope:
                    a = gpumem.alloc(self._size(rng))
                shadow = bytearray(a.size)
                a.memset(0)
                live[n].append((a, shadow))
                backup[a.ptr] = kept
                lost.discard(a.ptr)
                self._write(rng, a, shadow)
            allocated = gpumem.stats(self.DEV)["allocated"]
            # wake in random groups (or all at once)
            order = paused[:]
            rng.shuffle(order)
            if door == "vllm":
                while alloc.is_sleeping:
                    k = rng.randint(1, len(alloc.sleeping_tags))
                    alloc.wake_up(tags=[n for n in order if n in alloc.sleeping_tags][:k])
            elif paused and rng.random() < 0.5:
                saver.resume()
            else:
                for n in order:
                    saver.resume(n)
            self.assertEqual(gpumem.stats(self.DEV)["allocated"], allocated)
            self.assertEqual(gpumem.stats(self.DEV)["offloaded"], 0)
            # every kept byte is back; discarded blocks are rebuilt
            for n in names:
                for a, shadow in live[n]:
                    if a.ptr in lost:
                        v = rng.randrange(256)
                        a.memset(v)
                        shadow[:] = bytes([v]) * a.size
            self._check([x for n in names for x in live[n]], "%s cycle %d" % (door, cycle))
        for n in names:
            for a, _ in live[n]:
                a.free()

    def test_vllm_torture(self):
        self._run("vllm")

    def test_tms_torture(self):
        self._run("tms")


if __name__ == "__main__":
    unittest.main()
