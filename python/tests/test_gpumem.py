# SPDX-License-Identifier: Apache-2.0
"""Tests of the gpumem Python package on the sim backend (standard library only).

Run from the repository root after `make`:
    GPUMEM_BACKEND=sim python3 -m unittest discover -s python/tests
(ctest runs it with GPUMEM_LIBRARY pointing at the built library.)  The
PyTorch and CuPy adapters are driven through small fake `torch` / `cupy`
modules that record what the adapter does; the real frameworks are exercised
by scripts/device/plugins.sh on a GPU machine.
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import unittest
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("GPUMEM_BACKEND", "sim")
os.environ.setdefault("GPUMEM_SIM_CAPACITY", "4GiB")

import gpumem  # noqa: E402
import gpumem.cupy  # noqa: E402
import gpumem.torch  # noqa: E402

MiB = 1 << 20


def lib():
    return gpumem._library()[0]


class TestLibrary(unittest.TestCase):
    def test_loads_and_versions(self):
        self.assertTrue(gpumem.library_path())
        self.assertRegex(gpumem.version(), r"^\d+\.\d+\.\d+$")

    def test_bad_library_env_is_a_clear_error(self):
        env = dict(os.environ, GPUMEM_LIBRARY="/nonexistent/libgpumem.so")
        code = "import gpumem\ntry:\n    gpumem.version()\nexcept OSError as e:\n    print('ERR', e)\n"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        self.assertIn("ERR gpumem: GPUMEM_LIBRARY=/nonexistent/libgpumem.so", out.stdout, out.stderr)


class TestPools(unittest.TestCase):
    def test_stats_follow_allocations(self):
        dev = 7
        s0 = gpumem.stats(dev)
        for key in ("allocated", "allocated_peak", "reserved", "reserved_peak", "backend_calls"):
            self.assertIn(key, s0)
        a = gpumem.alloc(3 * MiB + 1, device=dev)
        self.assertNotEqual(a.ptr, 0)
        a.memset(0x3C)
        s1 = gpumem.stats(dev)
        self.assertEqual(s1["allocated"], s0["allocated"] + 3 * MiB + 1)
        self.assertGreaterEqual(s1["reserved"], 3 * MiB + 1)
        a.free()
        a.free()  # idempotent
        self.assertEqual(gpumem.stats(dev)["allocated"], s0["allocated"])

    def test_trim_gives_cached_memory_back(self):
        dev = 8
        with gpumem.alloc(16 * MiB, device=dev):
            pass
        cached = gpumem.stats(dev)["reserved"]
        self.assertGreaterEqual(cached, 16 * MiB)
        self.assertEqual(gpumem.trim(device=dev), cached)
        self.assertEqual(gpumem.stats(dev)["reserved"], 0)
        self.assertEqual(gpumem.trim(device=dev), 0)

    def test_limit_and_out_of_memory(self):
        dev = 9
        gpumem.set_limit(8 * MiB, device=dev)
        try:
            with self.assertRaises(gpumem.OutOfMemoryError) as cm:
                gpumem.alloc(64 * MiB, device=dev)
            self.assertIsInstance(cm.exception, MemoryError)
            self.assertEqual(cm.exception.name, "GM_LIMIT")
            self.assertTrue(gpumem.is_out_of_memory(cm.exception))
            with gpumem.alloc(4 * MiB, device=dev):
                pass
        finally:
            gpumem.set_limit(0, device=dev)

    def test_forget_stream_hands_its_blocks_to_everyone(self):
        dev = 10
        a = gpumem.alloc(6 * MiB, stream=0x77, device=dev)
        ptr = a.ptr
        a.free()  # cached on stream 0x77: other streams need an event on it first
        calls0 = gpumem.stats(dev)["backend_calls"]["event_record"]
        gpumem.forget_stream(0x77, device=dev)
        with gpumem.alloc(6 * MiB, stream=0x78, device=dev) as b:
            self.assertEqual(b.ptr, ptr)
        self.assertEqual(gpumem.stats(dev)["backend_calls"]["event_record"], calls0)

    def test_bad_device_is_a_gpumem_error(self):
        with self.assertRaises(gpumem.GpumemError) as cm:
            gpumem.stats(-1)
        self.assertEqual(cm.exception.name, "GM_INVALID_ARGUMENT")
        self.assertNotIsInstance(cm.exception, gpumem.OutOfMemoryError)

    def test_default_pool_is_device_zero(self):
        before = gpumem.stats(0)["allocated"]
        with gpumem.alloc(MiB):
            self.assertEqual(gpumem.stats(0)["allocated"], before + MiB)
            self.assertEqual(gpumem.stats()["allocated"], before + MiB)

    @unittest.skipUnless(hasattr(gpumem._library()[0], "gm_leak_report"),
                         "this libgpumem.so has no gm_leak_report yet")
    def test_leak_report_names_live_blocks(self):
        dev = 10
        a = gpumem.alloc(123456, device=dev)
        try:
            report = gpumem.leak_report(dev)
            self.assertIsInstance(report, str)
            self.assertTrue("123456" in report or ("%x" % a.ptr) in report.lower(), report)
            self.assertIsInstance(gpumem.leak_report(), str)
        finally:
            a.free()


class TestLeakReportProtocol(unittest.TestCase):
    """gpumem.leak_report() against gm_leak_report's contract (cap 0 asks
    the length; pool NULL means every pool), with a stand-in function."""

    def test_two_calls_and_pool_argument(self):
        text = b"2 live blocks: 0x1000 (4096 B), 0x2000 (123456 B)"
        calls = []

        class Lib:
            def gm_leak_report(self, pool, buf, cap, length):
                calls.append((pool, cap))
                length._obj.value = len(text)
                if cap:
                    n = min(cap - 1, len(text))
                    ctypes.memmove(buf, text, n)
                    buf[n] = b"\0"
                return 0 if cap == 0 or cap > len(text) else 1

        real = gpumem._library
        gpumem._library = lambda: (Lib(), "fake")
        try:
            self.assertEqual(gpumem.leak_report(), text.decode())
        finally:
            gpumem._library = real
        self.assertEqual(calls[0], (None, 0))
        self.assertIsNone(calls[1][0])
        self.assertGreater(calls[1][1], len(text))


class TestTorchAllocatorThrows(unittest.TestCase):
    """gm_torch_alloc's failure is a C++ std::runtime_error thrown into its
    caller (PyTorch catches it).  Here the caller is ctypes, which cannot
    catch it: the child process must die in std::terminate with our message,
    which shows the exception was built and thrown correctly."""

    CHILD = """
import ctypes, sys
ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
import gpumem
gpumem.set_limit(4 << 20, device=13)
lib = gpumem._library()[0]
lib.gm_torch_alloc.restype = ctypes.c_void_p
lib.gm_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
ok = lib.gm_torch_alloc(4096, 13, None)
print("small allocation:", bool(ok), flush=True)
lib.gm_torch_alloc(64 << 20, 13, None)
print("not thrown", flush=True)
"""

    def run_child(self, extra_env):
        env = dict(os.environ, **extra_env)
        return subprocess.run([sys.executable, "-c", self.CHILD], env=env, capture_output=True, text=True,
                              cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

    def setUp(self):
        try:
            ctypes.CDLL("libstdc++.so.6")
        except OSError:
            self.skipTest("no libstdc++.so.6 on this machine")

    def test_out_of_memory_throws_runtime_error(self):
        out = self.run_child({})
        self.assertIn("small allocation: True", out.stdout)
        self.assertNotIn("not thrown", out.stdout)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("std::runtime_error", out.stderr)
        self.assertIn("CUDA out of memory (gpumem): tried to allocate", out.stderr)

    def test_null_mode_returns_null(self):
        out = self.run_child({"GPUMEM_TORCH_OOM": "null"})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("not thrown", out.stdout)


class TestMaxBatchSize(unittest.TestCase):
    dev = 11

    def setUp(self):
        gpumem.set_limit(64 * MiB, device=self.dev)

    def tearDown(self):
        gpumem.set_limit(0, device=self.dev)

    def test_finds_the_largest_fitting_batch_and_leaves_nothing(self):
        calls = []

        def step(b):
            calls.append(b)
            held = [gpumem.alloc(MiB, device=self.dev) for _ in range(b)]  # b MiB in 1 MiB blocks
            big = gpumem.alloc(2 * MiB, device=self.dev)
            del held, big

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            best = gpumem.max_batch_size(step, 1, 1000, device=self.dev)
        self.assertEqual(best, 62)  # 62 MiB + 2 MiB = the 64 MiB limit
        self.assertLessEqual(len(calls), 2 + (1000 - 1).bit_length())
        s = gpumem.stats(self.dev)
        self.assertEqual(s["allocated"], 0)
        self.assertEqual(s["reserved"], 0)

    def test_hi_fits(self):
        self.assertEqual(gpumem.max_batch_size(lambda b: gpumem.alloc(b * MiB, device=self.dev), 1, 8,
                                               device=self.dev), 8)

    def test_lo_does_not_fit(self):
        with self.assertRaises(gpumem.OutOfMemoryError):
            gpumem.max_batch_size(lambda b: gpumem.alloc(b * MiB, device=self.dev), 100, 200,
                                  device=self.dev)

    def test_other_errors_propagate(self):
        def step(b):
            raise KeyError("not memory")
        with self.assertRaises(KeyError):
            gpumem.max_batch_size(step, 1, 4, device=self.dev)

    def test_bad_range(self):
        with self.assertRaises(ValueError):
            gpumem.max_batch_size(lambda b: None, 5, 4)
        with self.assertRaises(ValueError):
            gpumem.max_batch_size(lambda b: None, 0, 4)

    def test_memory_left_alive_is_reported(self):
        kept = []

        def step(b):
            kept.append(gpumem.alloc(MiB, device=self.dev))
        with self.assertWarns(ResourceWarning):
            gpumem.max_batch_size(step, 1, 2, device=self.dev)
        for a in kept:
            a.free()


def fake_torch(initialized=False, available=True, refuse=False):
    """A stand-in for `torch` recording what gpumem.torch.enable() does."""
    rec = {"hooks": {}}

    class Obj:
        pass
    obj = Obj()
    for name in ("set_reset_fn", "set_record_stream_fn", "set_memory_fraction_fn"):
        setattr(obj, name, (lambda n: lambda addr: rec["hooks"].__setitem__(n, addr))(name))

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_name, free_name):
            rec["plug"] = (path, alloc_name, free_name)

        def allocator(self):
            return obj

    def change_current_allocator(a):
        if refuse:
            raise RuntimeError("Can't swap an already initialized allocator")
        rec["changed"] = a

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: available, is_initialized=lambda: initialized,
        current_device=lambda: 0,
        memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                     change_current_allocator=change_current_allocator))
    return torch, rec


class TestCurrentDevice(unittest.TestCase):
    """device=None follows PyTorch's current device once PyTorch has
    initialized CUDA (as torch.cuda.memory_stats() does), else the default
    pool: a rank on device 1 must not read device 0's figures."""

    def setUp(self):
        self.saved = sys.modules.get("torch")

    def tearDown(self):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved

    def test_stats_follow_torch_current_device(self):
        sys.modules.pop("torch", None)
        base0 = gpumem.stats()["allocated"]
        a = gpumem.alloc(3 * MiB, device=1)
        try:
            # Without PyTorch (or before it initializes CUDA): the default pool.
            self.assertEqual(gpumem.stats()["allocated"], base0)
            torch, _ = fake_torch(initialized=False)
            torch.cuda.current_device = lambda: 1
            sys.modules["torch"] = torch
            self.assertEqual(gpumem.stats()["allocated"], base0)
            torch, _ = fake_torch(initialized=True)
            torch.cuda.current_device = lambda: 1
            sys.modules["torch"] = torch
            self.assertEqual(gpumem.stats()["allocated"], gpumem.stats(device=1)["allocated"])
            self.assertGreaterEqual(gpumem.stats()["allocated"], 3 * MiB)
            self.assertGreaterEqual(gpumem.stats()["allocated_peak"], 3 * MiB)
            b = gpumem.alloc(MiB)  # no device: the current device's pool
            self.assertEqual(b.device, 1)
            b.free()
            torch.cuda.current_device = lambda: 0
            self.assertEqual(gpumem.stats()["allocated"], base0)
        finally:
            a.free()


class TestTorchAdapter(unittest.TestCase):
    def setUp(self):
        self.saved = sys.modules.get("torch")
        self.saved_env = os.environ.pop("GPUMEM_TORCH_ALLOCATOR", None)
        gpumem.torch._state.update(enabled=False, allocator=None, hooks=(), kind=None)

    def tearDown(self):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved
        for name in ("torch.utils", "torch.utils.cpp_extension"):
            sys.modules.pop(name, None)
        os.environ.pop("GPUMEM_TORCH_ALLOCATOR", None)
        if self.saved_env is not None:
            os.environ["GPUMEM_TORCH_ALLOCATOR"] = self.saved_env
        gpumem.torch._state.update(enabled=False, allocator=None, hooks=(), kind=None)

    def test_enable_plugs_the_library_and_its_hooks(self):
        torch, rec = fake_torch()
        sys.modules["torch"] = torch
        gpumem.torch.enable(allocator="pluggable")
        self.assertTrue(gpumem.torch.is_enabled())
        self.assertEqual(gpumem.torch.allocator_kind(), "pluggable")
        self.assertEqual(rec["plug"], (gpumem.library_path(), "gm_torch_alloc", "gm_torch_free"))
        self.assertIn("changed", rec)
        addr = lambda sym: ctypes.cast(getattr(lib(), sym), ctypes.c_void_p).value  # noqa: E731
        self.assertEqual(rec["hooks"], {"set_reset_fn": addr("gm_torch_empty_cache"),
                                        "set_record_stream_fn": addr("gm_torch_record_stream"),
                                        "set_memory_fraction_fn": addr("gm_torch_set_memory_fraction")})
        self.assertEqual(len(gpumem.torch.hooks()), 3)
        gpumem.torch.enable()  # second call: nothing happens
        self.assertIn("allocated", gpumem.torch.memory_stats())

    def test_auto_falls_back_to_pluggable_with_a_warning(self):
        # A PyTorch without torch.utils.cpp_extension: the native allocator
        # cannot be built, "auto" says why and plugs the pluggable one.
        torch, rec = fake_torch()
        sys.modules["torch"] = torch
        with self.assertWarnsRegex(RuntimeWarning, "cpp_extension cannot be imported.*CUDAPluggableAllocator"):
            gpumem.torch.enable()
        self.assertEqual(gpumem.torch.allocator_kind(), "pluggable")
        self.assertIn("changed", rec)

    def test_native_that_cannot_be_built_is_a_clear_error(self):
        torch, rec = fake_torch()
        sys.modules["torch"] = torch
        os.environ["GPUMEM_TORCH_ALLOCATOR"] = "native"
        with self.assertRaisesRegex(gpumem.torch.TorchError, "cpp_extension cannot be imported"):
            gpumem.torch.enable()
        self.assertNotIn("changed", rec)
        self.assertIsNone(gpumem.torch.allocator_kind())

    def test_unknown_allocator_choice(self):
        torch, rec = fake_torch()
        sys.modules["torch"] = torch
        for bad in ("cuda", "", "NATIVE"):
            with self.assertRaisesRegex(gpumem.InvalidArgumentError, "choose one of auto, native, pluggable"):
                gpumem.torch.enable(allocator=bad)
        os.environ["GPUMEM_TORCH_ALLOCATOR"] = "bogus"
        with self.assertRaisesRegex(gpumem.InvalidArgumentError, "'bogus'"):
            gpumem.torch.enable()
        self.assertNotIn("changed", rec)

    def fake_build_env(self, script):
        """A fake torch.utils.cpp_extension and a fake compiler (a shell
        script given as text; $LOG gets one line per run)."""
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        cxx = os.path.join(tmp, "fakecxx")
        with open(cxx, "w") as f:
            f.write("#!/bin/sh\necho run >> %s/log\n%s\n" % (tmp, script))
        os.chmod(cxx, 0o755)
        torch, _ = fake_torch()
        torch.__version__ = "9.9.9+fake"
        torch._C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
        ext = types.ModuleType("torch.utils.cpp_extension")
        ext.CUDA_HOME = tmp
        ext.include_paths = lambda: [os.path.join(tmp, "inc")]
        ext.library_paths = lambda: [os.path.join(tmp, "lib")]
        utils = types.ModuleType("torch.utils")
        utils.cpp_extension = ext
        torch.utils = utils
        sys.modules.update({"torch": torch, "torch.utils": utils, "torch.utils.cpp_extension": ext})
        env = {"CXX": cxx, "GPUMEM_CACHE_DIR": os.path.join(tmp, "cache")}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

        def restore():
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(restore)
        return tmp

    def test_build_native_compiles_once_and_caches(self):
        # The fake compiler writes its output file (the argument after -o).
        tmp = self.fake_build_env('while [ $# -gt 0 ]; do [ "$1" = -o ] && echo lib > "$2"; shift; done')
        so = gpumem.torch.build_native()
        self.assertTrue(so.startswith(os.path.join(tmp, "cache", "torch-9.9.9_fake-")), so)
        self.assertTrue(so.endswith("libgpumem_torch.so"))
        self.assertEqual(gpumem.torch.build_native(), so)  # cached: no second compile
        with open(os.path.join(tmp, "log")) as f:
            self.assertEqual(f.read().count("run"), 1)
        self.assertEqual(os.listdir(os.path.dirname(so)), ["libgpumem_torch.so"])  # no temp left
        gpumem.torch.build_native(force=True)
        with open(os.path.join(tmp, "log")) as f:
            self.assertEqual(f.read().count("run"), 2)

    def test_build_native_falls_back_to_a_private_temporary_directory(self):
        tmp = self.fake_build_env('while [ $# -gt 0 ]; do [ "$1" = -o ] && echo lib > "$2"; shift; done')
        os.environ.pop("GPUMEM_CACHE_DIR")
        blocker = os.path.join(tmp, "not-a-dir")
        with open(blocker, "w") as f:
            f.write("x")
        saved = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "TMPDIR")}
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                                 for k, v in saved.items()])
        os.environ["XDG_CACHE_HOME"] = blocker  # ~/.cache cannot be made
        os.environ["TMPDIR"] = os.path.join(tmp, "t")
        os.mkdir(os.environ["TMPDIR"])
        tempfile.tempdir = None  # read TMPDIR again
        self.addCleanup(setattr, tempfile, "tempdir", None)
        so = gpumem.torch.build_native()
        private = os.path.join(tmp, "t", "gpumem-%d" % os.getuid())
        self.assertTrue(so.startswith(private + os.sep), so)
        self.assertEqual(os.stat(private).st_mode & 0o777, 0o700)
        # A fallback directory others may write is refused, never used.
        os.chmod(private, 0o777)
        with self.assertRaisesRegex(gpumem.torch.TorchError, "only it may write"):
            gpumem.torch.build_native(force=True)

    def test_build_native_failure_carries_the_compiler_output(self):
        tmp = self.fake_build_env("echo 'torch_allocator.cpp:1: error: boom' >&2; exit 3")
        with self.assertRaisesRegex(gpumem.torch.TorchError, "(?s)exit 3.*error: boom"):
            gpumem.torch.build_native()
        cache = os.path.join(tmp, "cache")
        for d in os.listdir(cache):
            self.assertEqual(os.listdir(os.path.join(cache, d)), [])  # nothing half-written kept

    def test_enable_after_cuda_init_is_a_clear_error(self):
        torch, rec = fake_torch(initialized=True)
        sys.modules["torch"] = torch
        with self.assertRaisesRegex(gpumem.torch.TorchError, "before PyTorch initializes CUDA"):
            gpumem.torch.enable(allocator="pluggable")
        self.assertNotIn("changed", rec)
        self.assertFalse(gpumem.torch.is_enabled())

    def test_enable_refused_by_torch_is_a_clear_error(self):
        torch, _ = fake_torch(refuse=True)
        sys.modules["torch"] = torch
        with self.assertRaisesRegex(gpumem.torch.TorchError, "right after `import torch`"):
            gpumem.torch.enable(allocator="pluggable")
        self.assertFalse(gpumem.torch.is_enabled())

    def test_no_cuda(self):
        torch, _ = fake_torch(available=False)
        sys.modules["torch"] = torch
        with self.assertRaisesRegex(gpumem.torch.TorchError, "no CUDA device"):
            gpumem.torch.enable()

    def test_no_torch(self):
        sys.modules["torch"] = None  # makes `import torch` fail
        with self.assertRaisesRegex(ImportError, "gpumem.torch needs PyTorch"):
            gpumem.torch.enable()


def fake_cupy():
    rec = {}

    class OutOfMemoryError(MemoryError):
        def __init__(self, size, total, limit=0):
            super().__init__(size, total)
            self.size = size

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError, UnownedMemory=UnownedMemory,
                                   MemoryPointer=MemoryPointer, get_allocator=lambda: "previous")
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(
        memory=memory,
        runtime=types.SimpleNamespace(getDevice=lambda: 12,
                                      setDevice=lambda d: rec.setdefault("set_device", []).append(d)),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x1234),
        set_allocator=lambda fn: rec.__setitem__("allocator", fn))
    return cupy, rec


class TestCupyAdapter(unittest.TestCase):
    def setUp(self):
        self.saved = sys.modules.get("cupy")
        gpumem.cupy._state.update(enabled=False, previous=None)
        gpumem.cupy._thread.__dict__.clear()  # this thread has made no device current yet

    def tearDown(self):
        if self.saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = self.saved
        gpumem.cupy._state.update(enabled=False, previous=None)

    def test_allocations_come_from_the_device_pool(self):
        cupy, rec = fake_cupy()
        sys.modules["cupy"] = cupy
        gpumem.cupy.enable()
        malloc = rec["allocator"]
        base = gpumem.stats(12)["allocated"]
        p = malloc(5 * MiB)
        self.assertNotEqual(p.ptr, 0)
        self.assertEqual(p.mem.device_id, 12)
        self.assertEqual(gpumem.stats(12)["allocated"], base + 5 * MiB)
        del p
        self.assertEqual(gpumem.stats(12)["allocated"], base)
        # The device is made current once per thread (the first allocation
        # there), as the C path does.
        malloc(1 * MiB)
        self.assertEqual(rec.get("set_device"), [12])
        t = threading.Thread(target=lambda: malloc(1 * MiB))
        t.start()
        t.join()
        self.assertEqual(rec.get("set_device"), [12, 12])
        gpumem.set_limit(4 * MiB, device=12)
        try:
            with self.assertRaises(cupy.cuda.memory.OutOfMemoryError) as cm:
                malloc(64 * MiB)
            self.assertTrue(gpumem.is_out_of_memory(cm.exception))
        finally:
            gpumem.set_limit(0, device=12)
        gpumem.cupy.disable()
        self.assertEqual(rec["allocator"], "previous")

    def test_no_cupy(self):
        sys.modules["cupy"] = None
        with self.assertRaisesRegex(ImportError, "gpumem.cupy needs CuPy"):
            gpumem.cupy.enable()


class TestCupyCPath(unittest.TestCase):
    """gpumem.cupy's C path: CFunctionAllocator over gm_cupy_malloc /
    gm_cupy_free, driven by a fake CuPy whose cupy.cuda.stream exports a C
    get_current_stream_ptr (a ctypes callback) the way Cython does."""
    DEV = 13
    S1, S2 = 0x5100, 0x5200

    def setUp(self):
        self.saved = {k: sys.modules.get(k) for k in ("cupy", "cupy.cuda.stream")}
        gpumem.cupy._state.update(enabled=False, previous=None, path=None)
        self.current = [self.S1]
        self.fn = ctypes.CFUNCTYPE(ctypes.c_ssize_t)(lambda: self.current[0])
        api = ctypes.pythonapi
        api.PyCapsule_New.restype = ctypes.py_object
        api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.name = ctypes.c_char_p(b"intptr_t (void)")  # the capsule keeps the pointer
        capsule = api.PyCapsule_New(ctypes.cast(self.fn, ctypes.c_void_p), self.name, None)
        stream = types.ModuleType("cupy.cuda.stream")
        stream.__pyx_capi__ = {"get_current_stream_ptr": capsule}
        self.cupy, self.rec = fake_cupy()
        pydll = ctypes.PyDLL(gpumem.library_path())  # holds the GIL, raises what C sets
        malloc, free = pydll.gm_cupy_malloc, pydll.gm_cupy_free
        malloc.argtypes, malloc.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_void_p
        free.argtypes, free.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int), None
        rec, dev = self.rec, self.DEV

        class CFunctionAllocator:
            def __init__(self, param, malloc_func, free_func, owner):
                rec["c"] = (param, malloc_func, free_func, owner)

            def malloc(self, size):  # what CuPy's Cython does, through ctypes
                param, m, f, _ = rec["c"]
                assert m == ctypes.cast(malloc, ctypes.c_void_p).value
                assert f == ctypes.cast(free, ctypes.c_void_p).value
                return malloc(param, size, dev)

            def free(self, ptr):
                free(rec["c"][0], ptr, dev)

        self.cupy.cuda.memory.CFunctionAllocator = CFunctionAllocator
        self.cupy.cuda.stream = stream
        sys.modules.update({"cupy": self.cupy, "cupy.cuda.stream": stream})

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        gpumem.cupy._state.update(enabled=False, previous=None, path=None)
        gpumem.set_limit(0, device=self.DEV)
        self.assertEqual(gpumem.stats(self.DEV)["allocated"], 0, "a test left memory allocated")

    def test_c_path_is_taken_and_frees_on_the_allocation_stream(self):
        gpumem.cupy.enable()
        self.assertEqual(gpumem.cupy.path(), "c")
        alloc = self.rec["c"]
        self.assertEqual(self.rec["allocator"].__self__.__class__.__name__, "CFunctionAllocator")
        self.assertIsNotNone(alloc[3])  # the owner keeps the hooks alive
        a = self.rec["allocator"](3 * MiB)
        self.assertTrue(a)
        self.assertEqual(gpumem.stats(self.DEV)["allocated"], 3 * MiB)
        pool = gpumem._pool(self.DEV)
        lib().gm_sim_hold_stream(pool, ctypes.c_void_p(self.S2), 1)  # S2's work stays in flight
        try:
            self.current[0] = self.S2  # CuPy's current stream changed since
            self.assertEqual(lib().gm_memset(pool, ctypes.c_void_p(a), 0, 3 * MiB, ctypes.c_void_p(self.S2)), 0)
            self.rec["allocator"].__self__.free(a)
            self.assertEqual(gpumem.stats(self.DEV)["allocated"], 0)
            # Freed on S1 (where it was made), not on S2: S1 takes the block
            # back at once, while S2's work on it is still in flight (a block
            # freed on S2 would wait for that work).
            self.current[0] = self.S1
            c = self.rec["allocator"](3 * MiB)
            self.assertEqual(c, a)
            self.rec["allocator"].__self__.free(c)
        finally:
            lib().gm_sim_hold_stream(pool, ctypes.c_void_p(self.S2), 0)
        self.assertIsNone(self.rec["allocator"](0))

    def test_c_path_raises_cupys_out_of_memory_error(self):
        gpumem.cupy.enable(path="c")
        gpumem.set_limit(4 * MiB, device=self.DEV)
        with self.assertRaises(self.cupy.cuda.memory.OutOfMemoryError) as cm:
            self.rec["allocator"](64 * MiB)
        self.assertEqual(cm.exception.size, 64 * MiB)
        self.assertEqual(gpumem.stats(self.DEV)["allocated"], 0)

    def test_bad_hooks_raise_gpumem_error(self):
        gpumem.cupy.enable(path="c")
        hooks = gpumem.cupy._state["keep"][1][0]
        hooks.version = 99
        try:
            with self.assertRaisesRegex(gpumem.GpumemError, "hooks missing, of another version"):
                self.rec["allocator"](MiB)
        finally:
            hooks.version = 1

    def test_signature_mismatch_falls_back_to_python(self):
        api = ctypes.pythonapi
        other = ctypes.c_char_p(b"intptr_t (int __pyx_skip_dispatch)")
        self.cupy.cuda.stream.__pyx_capi__["get_current_stream_ptr"] = api.PyCapsule_New(
            ctypes.cast(self.fn, ctypes.c_void_p), other, None)
        self.keep_name = other
        with self.assertRaisesRegex(RuntimeError, "signature"):
            gpumem.cupy.enable(path="c")
        gpumem.cupy.enable()
        self.assertEqual(gpumem.cupy.path(), "python")

    def test_unknown_path(self):
        with self.assertRaisesRegex(gpumem.InvalidArgumentError, "choose one of auto, c, python"):
            gpumem.cupy.enable(path="fast")


def read_device(dev, ptr, n):
    """n bytes at device address ptr of the pool of dev (sim: unified addressing)."""
    buf = ctypes.create_string_buffer(n)
    pool = gpumem._pool(dev)
    assert lib().gm_memcpy(pool, buf, ctypes.c_void_p(ptr), n, None) == 0
    assert lib().gm_stream_synchronize(pool, None) == 0
    return buf.raw


@unittest.skipUnless(hasattr(gpumem._library()[0], "gm_offload"),
                     "this libgpumem.so has no tags, offload or restore yet")
class TestTags(unittest.TestCase):
    """gpumem.tag / offload / restore / tag_info / acquire / release on the sim."""
    DEV = 14  # a pool of its own

    def tearDown(self):
        self.assertEqual(gpumem.stats(self.DEV)["allocated"], 0, "a test left memory allocated")

    def test_scope_tags_what_the_thread_allocates(self):
        t = gpumem.tag("py-scope")
        self.assertIs(gpumem.tag("py-scope"), t)
        self.assertEqual((t.name, t.flags, t.discard, t.evictable), ("py-scope", 0, False, False))
        inner = gpumem.tag("py-scope-inner")
        with t as entered:
            self.assertIs(entered, t)
            a = gpumem.alloc(3 * MiB, device=self.DEV)
            with inner:
                b = gpumem.alloc(MiB, device=self.DEV)
            c = gpumem.alloc(2 * MiB, device=self.DEV)  # the outer tag is back
        d = gpumem.alloc(MiB, device=self.DEV)           # no tag after the block
        try:
            self.assertEqual(gpumem.tag_info(t, self.DEV)["resident_bytes"], 5 * MiB)
            self.assertEqual(gpumem.tag_info(t, self.DEV)["resident_blocks"], 2)
            self.assertEqual(gpumem.tag_info("py-scope-inner", self.DEV)["resident_bytes"], MiB)
        finally:
            for x in (a, b, c, d):
                x.free()
        self.assertEqual(gpumem.tag_info(t, self.DEV)["resident_blocks"], 0)

    def test_scope_is_per_thread(self):
        import threading
        t = gpumem.tag("py-thread")
        ready, done = threading.Event(), threading.Event()

        def other():
            with t:
                ready.set()
                done.wait(10)
        th = threading.Thread(target=other)
        th.start()
        try:
            self.assertTrue(ready.wait(10))
            with gpumem.alloc(MiB, device=self.DEV):  # this thread has no tag
                self.assertEqual(gpumem.tag_info(t, self.DEV)["resident_blocks"], 0)
        finally:
            done.set()
            th.join()

    def test_offload_restore_keeps_address_and_data(self):
        t = gpumem.tag("py-weights")
        with t:
            a = gpumem.alloc(5 * MiB + 123, device=self.DEV)
        try:
            a.memset(0x5A)
            a.memset(0x11, size=100, offset=4 * MiB)
            ptr = a.ptr
            before = gpumem.stats(self.DEV)
            gpumem.offload("py-weights", device=self.DEV)
            info = gpumem.tag_info(t, self.DEV)
            self.assertEqual((info["offloaded_blocks"], info["offloaded_bytes"], info["resident_blocks"]),
                             (1, 5 * MiB + 123, 0))
            self.assertEqual(info["offloads"], 1)
            mid = gpumem.stats(self.DEV)
            self.assertEqual(mid["offloaded"], 5 * MiB + 123)
            self.assertEqual(mid["allocated"], before["allocated"])  # still allocated
            self.assertLessEqual(mid["reserved"], before["reserved"] - 4 * MiB)
            gpumem.restore(t, device=self.DEV)
            self.assertEqual(a.ptr, ptr)
            data = read_device(self.DEV, ptr, 5 * MiB + 123)
            self.assertEqual(data[:4 * MiB], b"\x5a" * (4 * MiB))
            self.assertEqual(data[4 * MiB:4 * MiB + 100], b"\x11" * 100)
            self.assertEqual(data[4 * MiB + 100:], b"\x5a" * (MiB + 23))
            info = gpumem.tag_info(t, self.DEV)
            self.assertEqual((info["resident_bytes"], info["offloaded_blocks"], info["restores"]),
                             (5 * MiB + 123, 0, 1))
            gpumem.restore(t, device=self.DEV)  # nothing offloaded: nothing to do
            s = gpumem.stats(self.DEV)
            self.assertGreaterEqual(s["offload_bytes_total"], 5 * MiB + 123)
            self.assertGreaterEqual(s["restore_bytes_total"], 5 * MiB + 123)
            self.assertEqual(s["offloaded"], 0)
        finally:
            a.free()

    def test_prepare_offload(self):
        t = gpumem.tag("py-prepared")
        with t:
            a = gpumem.alloc(9 * MiB + 5, device=self.DEV)
        try:
            a.memset(0x3C)
            before = gpumem.stats(self.DEV)["host_reserved"]
            t.prepare_offload(background=False, device=self.DEV)
            after = gpumem.stats(self.DEV)["host_reserved"]
            self.assertGreater(after, before)  # (pinned memory free already counts)
            self.assertGreaterEqual(after, 9 * MiB)
            gpumem.prepare_offload("py-prepared", device=self.DEV)  # background
            gpumem.prepare_wait(self.DEV)
            gpumem.prepare_wait(self.DEV)  # nothing running: returns
            t.offload(device=self.DEV)
            t.restore(device=self.DEV)
            self.assertEqual(read_device(self.DEV, a.ptr, 9 * MiB + 5), b"\x3c" * (9 * MiB + 5))
            with self.assertRaises(TypeError):
                gpumem.prepare_offload(t, background=1, device=self.DEV)
        finally:
            a.free()

    def test_offload_then_free(self):
        t = gpumem.tag("py-free")
        with t:
            a = gpumem.alloc(3 * MiB, device=self.DEV)
        t.offload(device=self.DEV)
        self.assertEqual(t.info(self.DEV)["offloaded_blocks"], 1)
        a.free()  # frees the host copy
        self.assertEqual(t.info(self.DEV)["offloaded_blocks"], 0)
        self.assertEqual(gpumem.stats(self.DEV)["offloaded"], 0)
        t.restore(device=self.DEV)

    def test_discard(self):
        kv = gpumem.tag("py-kv", discard=True)
        self.assertTrue(kv.discard)
        self.assertIs(gpumem.tag("py-kv"), kv)
        self.assertIs(gpumem.tag("py-kv", discard=True), kv)
        with self.assertRaises(gpumem.InvalidArgumentError):
            gpumem.tag("py-kv", discard=False)
        with kv:
            a = gpumem.alloc(4 * MiB, device=self.DEV)
        plain = gpumem.tag("py-discard-flag")
        with plain:
            b = gpumem.alloc(2 * MiB, device=self.DEV)
        try:
            gpumem.offload("py-kv", device=self.DEV)
            gpumem.offload(plain, discard=True, device=self.DEV)
            for t, n in ((kv, 4 * MiB), (plain, 2 * MiB)):
                self.assertEqual(gpumem.tag_info(t, self.DEV)["offloaded_bytes"], n)
                gpumem.restore(t, device=self.DEV)
                self.assertEqual(gpumem.tag_info(t, self.DEV)["resident_bytes"], n)
            a.memset(1)  # fresh pages are usable
        finally:
            a.free()
            b.free()

    def test_tag_made_elsewhere_is_found_with_its_flags(self):
        t = ctypes.c_uint32()
        self.assertEqual(lib().gm_tag_get(b"py-made-in-c", 2, ctypes.byref(t)), 0)
        found = gpumem.tag("py-made-in-c")
        self.assertEqual((found.id, found.flags, found.evictable), (t.value, 2, True))
        self.assertEqual(gpumem.tag_info("py-made-in-c", self.DEV)["flags"], 2)

    def test_acquire_release(self):
        ev = gpumem.tag("py-evictable", evictable=True)
        with ev:
            a = gpumem.alloc(MiB, device=self.DEV)
        try:
            with self.assertRaises(gpumem.GpumemError) as cm:
                gpumem.release(ev, device=self.DEV)
            self.assertEqual(cm.exception.name, "GM_INVALID_STATE")
            gpumem.offload(ev, device=self.DEV)
            gpumem.acquire("py-evictable", device=self.DEV)  # restores it
            info = gpumem.tag_info(ev, self.DEV)
            self.assertEqual((info["holds"], info["resident_blocks"]), (1, 1))
            gpumem.release(ev, device=self.DEV)
            self.assertEqual(gpumem.tag_info(ev, self.DEV)["holds"], 0)
        finally:
            a.free()

    def test_bad_arguments(self):
        for bad in (5, None, 1.5, ["x"]):
            with self.subTest(name=bad):
                with self.assertRaises(TypeError):
                    gpumem.tag(bad)
        for bad in ("", "x" * 64, "a\0b"):
            with self.subTest(name=bad):
                with self.assertRaises(gpumem.InvalidArgumentError):
                    gpumem.tag(bad)
        self.assertEqual(len(gpumem.tag("y" * 63).name), 63)
        with self.assertRaises(TypeError):
            gpumem.tag("py-bad", discard=1)
        for fn in (gpumem.offload, gpumem.restore, gpumem.tag_info, gpumem.acquire, gpumem.release):
            with self.subTest(fn=fn.__name__):
                with self.assertRaises(TypeError):
                    fn(7)
                with self.assertRaises(ValueError):
                    fn("py-bad", device=-1)
        with self.assertRaises(TypeError):
            gpumem.offload("py-bad", discard=1)
        with self.assertRaises(TypeError):
            gpumem.restore("py-bad", stream=1.0)

    def test_default_stream_is_torchs_current_stream(self):
        saved = sys.modules.get("torch")
        seen = []

        def current_stream(device=None):
            seen.append(device)
            return types.SimpleNamespace(cuda_stream=0x5151)
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_initialized=lambda: True, current_stream=current_stream)
        sys.modules["torch"] = torch
        try:
            self.assertEqual(gpumem._default_stream(None, None, "t"), 0x5151)
            self.assertEqual(gpumem._default_stream(None, 3, "t"), 0x5151)
            self.assertEqual(seen, [None, 3])
            self.assertEqual(gpumem._default_stream(7, None, "t"), 7)
            torch.cuda.is_initialized = lambda: False
            self.assertEqual(gpumem._default_stream(None, None, "t"), 0)
            if os.environ.get("GPUMEM_BACKEND") != "sim":
                return  # 0x5151 names a stream on the sim only
            t = gpumem.tag("py-torch-stream")
            with t:
                a = gpumem.alloc(MiB, stream=0x5151, device=self.DEV)
            torch.cuda.is_initialized = lambda: True
            gpumem.offload(t, device=self.DEV)
            gpumem.restore(t, device=self.DEV)
            self.assertEqual(gpumem.tag_info(t, self.DEV)["restores"], 1)
            a.free()
        finally:
            if saved is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = saved


if __name__ == "__main__":
    unittest.main()
