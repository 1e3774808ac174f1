# SPDX-License-Identifier: Apache-2.0
"""gpumem.share on the sim backend: a server here, an importer in a child
process (standard library only; the torch views are exercised on the GPU)."""
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("GPUMEM_BACKEND", "sim")
os.environ.setdefault("GPUMEM_SIM_CAPACITY", "4GiB")

import gpumem  # noqa: E402
import gpumem.share as share  # noqa: E402

MiB = 1 << 20
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CHILD = textwrap.dedent("""
    import ctypes, sys
    import gpumem, gpumem.share as share
    cli = share.Client(sys.argv[1])
    imp = cli.open("w")
    lib = gpumem._library()[0]
    pool = gpumem._pool(None)
    buf = ctypes.create_string_buffer(16)
    assert lib.gm_memcpy(pool, buf, ctypes.c_void_p(imp.ptr), 16, None) == 0
    try:
        cli.open("ro")
        denied = "no"
    except gpumem.GpumemError as e:
        denied = e.name
    ro = cli.open("ro", token="tok")
    wrote = lib.gm_memset(pool, ctypes.c_void_p(ro.ptr), 0, 1, None)
    print(buf.raw[:4].hex(), imp.size, ro.read_only, denied, wrote,
          share.stats()["imports"])
    parts = cli.open_many("many")
    sizes = [p.size for p in parts]
    ok = all(lib.gm_memcpy(pool, buf, ctypes.c_void_p(p.ptr), 1, None) == 0 and
             buf.raw[0] == i + 1 for i, p in enumerate(parts))
    print(sizes == [1 << 20, 2 << 20, 3 << 20] and ok)
    parts[0].release()
    ro.release(); imp.release(); cli.close()
    print(share.stats()["imports"])
""")


class TestShare(unittest.TestCase):
    def test_publish_import_release(self):
        path = os.path.join(tempfile.gettempdir(), "gm-pyshare-%d.sock" % os.getpid())
        buf = share.Buffer(3 * MiB)
        lib = gpumem._library()[0]
        self.assertEqual(lib.gm_memset(gpumem._pool(None), buf.ptr, 0xab, buf.size, None), 0)
        with share.Server(path) as srv:
            srv.publish("w", buf)
            srv.publish("ro", buf, size=MiB, read_only=True, token="tok")
            parts = [share.Buffer((i + 1) * MiB) for i in range(3)]
            for i, b in enumerate(parts):
                lib.gm_memset(gpumem._pool(None), b.ptr, i + 1, b.size, None)
            srv.publish_many("many", parts)
            with self.assertRaises(gpumem.InvalidArgumentError):
                srv.publish("bad name", buf)
            with self.assertRaises(gpumem.GpumemError):
                srv.publish("small", gpumem.alloc(4096).ptr, size=4096)  # not on pages of its own
            self.assertEqual(share.stats()["published"], 3)
            env = dict(os.environ, PYTHONPATH=HERE)
            out = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            first, many, second = out.stdout.split("\n")[:3]
            self.assertEqual(many, "True")
            self.assertEqual(first.split(), ["abababab", str(3 * MiB), "True", "GM_DENIED",
                                             "8", "2"])  # 8: GM_BACKEND, a refused write
            self.assertEqual(second, "0")
            deadline = time.time() + 5
            while share.stats()["exported_bytes"] and time.time() < deadline:
                time.sleep(0.01)
            self.assertEqual(share.stats()["exported_bytes"], 0)
            buf.free()  # published: kept until unpublished
            self.assertEqual(share.stats()["held_for_peers_bytes"], 4 * MiB)
        self.assertEqual(share.stats()["held_for_peers_bytes"], 0)
        self.assertFalse(os.path.exists(path))


if __name__ == "__main__":
    unittest.main()
