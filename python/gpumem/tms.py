# SPDX-License-Identifier: Apache-2.0
"""gpumem.tms — torch_memory_saver's calls, on gpumem tags and offload.

Code written for torch_memory_saver switches with its import:

    import gpumem.tms as torch_memory_saver     # was: import torch_memory_saver
    from gpumem.tms import torch_memory_saver   # was: from torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = build().cuda()                  # kept over a pause
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(..., device="cuda")    # enable_cpu_backup=False: discarded on pause
    torch_memory_saver.pause()                  # every tag (or pause("kv_cache"))
    torch_memory_saver.resume()                 # same addresses; backed-up bytes are back

A region's memory goes to the gpumem tag "tms.keep/<tag>" (enable_cpu_backup
True) or "tms.drop/<tag>" (False: discarded, made with GM_TAG_DISCARD), so one
torch_memory_saver tag may hold both kinds, as it may there.  The state
(which tags are paused) is the process's, shared by every TorchMemorySaver.

Misuse raises SleepStateError (pausing a paused tag, resuming one that is not
paused); pause or resume of a tag no region ever used does nothing, as in
torch_memory_saver.  Not covered: disk backup, get_cpu_backup, the
LD_PRELOAD hook (configure_subprocess() changes nothing: docs/sleep.md).
"""
import contextlib

import gpumem as _gm
from . import _doors
from ._doors import SleepStateError

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess", "SleepStateError",
           "KEEP_PREFIX", "DROP_PREFIX"]

KEEP_PREFIX = "tms.keep/"
DROP_PREFIX = "tms.drop/"
_NAME_ROOM = _gm._TAG_NAME_MAX - max(len(KEEP_PREFIX), len(DROP_PREFIX))
_TAG_DEFAULT = "default"
_HOOK_MODES = ("preload", "torch")
_BACKUP_BACKENDS = ("pinned", "mmap")


class _Tag:
    """A torch_memory_saver tag: its two gpumem tags, made when first used."""

    __slots__ = ("keep", "drop", "paused")

    def __init__(self):
        self.keep = None     # _doors.DoorTag of "tms.keep/<tag>"
        self.drop = None     # _doors.DoorTag of "tms.drop/<tag>"
        self.paused = False

    def parts(self):
        return [p for p in (self.keep, self.drop) if p is not None]


class _Registry:
    """The process's torch_memory_saver tags and which are paused."""

    def __init__(self):
        self.lock = _doors.new_lock()
        self.tags = {}       # name -> _Tag, in the order first used

    def door_tag(self, name, backup):
        with self.lock:
            t = self.tags.setdefault(name, _Tag())
            if backup:
                if t.keep is None:
                    t.keep = _doors.DoorTag(name, _gm.tag(KEEP_PREFIX + name, discard=False))
                return t.keep
            if t.drop is None:
                t.drop = _doors.DoorTag(name, _gm.tag(DROP_PREFIX + name, discard=True))
            return t.drop


_registry = _Registry()


def _tag_arg(tag, what):
    """None (every tag) or a tag name."""
    if tag is None:
        return None
    return _doors.check_name(tag, what, _NAME_ROOM)


class TorchMemorySaver:
    """torch_memory_saver's object, on gpumem.  The module's
    torch_memory_saver is the one most code uses; others share its state."""

    def __init__(self):
        self._hook_mode = "preload"
        self._memory_margin_bytes = 0
        self._retain_cpu_backup = False

    # ---- regions -------------------------------------------------------------

    @contextlib.contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False,
               cpu_backup_backend=None):
        """Inside the block, this thread's CUDA allocations belong to `tag`:
        with enable_cpu_backup their contents survive a pause (copied to
        pinned host memory), without it they are discarded.  Regions nest;
        the outer one is back on exit."""
        _doors.check_name(tag, "region", _NAME_ROOM)
        self._check_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        _doors.route_allocations("torch_memory_saver.region")
        dt = _registry.door_tag(tag, bool(enable_cpu_backup))
        with dt.scope():
            yield

    @staticmethod
    def _check_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        for value, what in ((enable_cpu_backup, "enable_cpu_backup"), (enable_disk_backup, "enable_disk_backup")):
            if not isinstance(value, bool):
                raise TypeError("region: %s must be True or False, not %s" % (what, type(value).__name__))
        if enable_cpu_backup and enable_disk_backup:
            raise ValueError("region: enable_cpu_backup and enable_disk_backup are mutually exclusive")
        if enable_disk_backup:
            raise NotImplementedError("region: gpumem has no disk backup; use enable_cpu_backup=True "
                                      "(pinned host memory)")
        if cpu_backup_backend is not None:
            if not enable_cpu_backup:
                raise ValueError("region: cpu_backup_backend requires enable_cpu_backup=True")
            if cpu_backup_backend not in _BACKUP_BACKENDS:
                raise ValueError("region: cpu_backup_backend must be one of %s, got %r"
                                 % (", ".join(_BACKUP_BACKENDS), cpu_backup_backend))

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global",
                   tag=_TAG_DEFAULT, enable_cpu_backup=False, cpu_backup_backend=None):
        """torch.cuda.graph(...) whose memory belongs to `tag` as in region().
        Needs gpumem.torch's native allocator (graph private pools); not yet
        run on a GPU through this door (docs/sleep.md)."""
        import torch
        with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
            with self.region(tag=tag, enable_cpu_backup=enable_cpu_backup,
                             cpu_backup_backend=cpu_backup_backend):
                yield

    @contextlib.contextmanager
    def disable(self):
        """Inside the block, this thread's allocations belong to no tag (never
        paused), even inside a region."""
        with _doors.untagged():
            yield

    # ---- pause and resume ------------------------------------------------------

    def pause(self, tag=None):
        """Give back the device memory of `tag` (None: of every tag not paused
        yet).  Backed-up memory is copied to pinned host memory first, the rest
        is discarded; the addresses stay reserved.  Raises SleepStateError for
        a paused tag (or, with None, when every tag is paused).  A tag no
        region used: nothing to do.  If a copy fails, what this call paused is
        resumed and the error raised (nothing lost)."""
        tag = _tag_arg(tag, "pause")
        with _registry.lock:
            if tag is None:
                names = [n for n, t in _registry.tags.items() if not t.paused]
                if _registry.tags and not names:
                    raise SleepStateError("pause(): every tag is paused already (%s)"
                                          % ", ".join(_registry.tags))
            elif tag not in _registry.tags:
                return
            elif _registry.tags[tag].paused:
                raise SleepStateError("pause(%r): the tag is paused already; resume it first" % tag)
            else:
                names = [tag]
            tags = [_registry.tags[n] for n in names]
            started = []
            try:
                for t in tags:           # the copies first: they may fail and be undone
                    if t.keep is not None:
                        started.append(t.keep)
                        t.keep.offload(discard=False)
            except BaseException as e:
                for dt in started:
                    try:
                        dt.restore()
                    except Exception as again:  # noqa: BLE001 -- the first error is the one raised
                        _doors.note(e, "and resuming %r back failed: %s" % (dt.tag.name, again))
                raise
            for t in tags:
                t.paused = True
            for t in tags:               # discarding moves no data: nothing to undo
                if t.drop is not None:
                    t.drop.offload(discard=True)

    def prepare_pause(self, tag=None, background=True):
        """(gpumem's own, not torch_memory_saver's) Pin now the host memory
        that pause() will copy backed-up memory of `tag` (None: every tag)
        into, so that the first pause runs at the speed of later ones;
        background=True returns at once (the pause waits for it)."""
        tag = _tag_arg(tag, "prepare_pause")
        if not isinstance(background, bool):
            raise TypeError("prepare_pause: background must be True or False")
        with _registry.lock:
            names = list(_registry.tags) if tag is None else [tag] if tag in _registry.tags else []
            for n in names:
                t = _registry.tags[n]
                if t.keep is not None:
                    t.keep.prepare(background)

    def resume(self, tag=None):
        """Map device memory again at the same addresses for `tag` (None: every
        paused tag) and copy backed-up bytes back; discarded memory comes back
        with undefined contents.  Raises SleepStateError for a tag that is not
        paused (or, with None, when none is).  All or nothing: if pages cannot
        be had, what this call resumed is paused again and the error raised."""
        tag = _tag_arg(tag, "resume")
        with _registry.lock:
            if tag is None:
                names = [n for n, t in _registry.tags.items() if t.paused]
                if _registry.tags and not names:
                    raise SleepStateError("resume(): no tag is paused")
            elif tag not in _registry.tags:
                return
            elif not _registry.tags[tag].paused:
                raise SleepStateError("resume(%r): the tag is not paused" % tag)
            else:
                names = [tag]
            woken = []                   # (DoorTag, pools woken, discard)
            try:
                for n in names:
                    t = _registry.tags[n]
                    for dt, discard in ((t.keep, False), (t.drop, True)):
                        if dt is None:
                            continue
                        try:
                            woken.append((dt, dt.restore(), discard))
                        except _gm.GpumemError as e:
                            woken.append((dt, getattr(e, "pools_done", []), discard))
                            raise
            except BaseException as e:
                for dt, pools, discard in woken:
                    for pool in pools:
                        view = _doors.DoorTag(dt.name, dt.tag)
                        view.pools = {pool: dt.pools[pool]}
                        try:
                            view.offload(discard=discard)
                        except Exception as again:  # noqa: BLE001
                            _doors.note(e, "and pausing %r again failed: %s" % (dt.tag.name, again))
                raise
            for n in names:
                _registry.tags[n].paused = False

    # ---- settings and queries ----------------------------------------------------

    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, mode):
        """Accepted for compatibility ("preload" or "torch"); either way PyTorch's
        memory reaches gpumem through gpumem.torch, in this process."""
        if mode not in _HOOK_MODES:
            raise ValueError("hook_mode must be one of %s, got %r" % (", ".join(_HOOK_MODES), mode))
        self._hook_mode = mode

    @property
    def memory_margin_bytes(self):
        return self._memory_margin_bytes

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        """Accepted and recorded, not enforced: gpumem's resume is all or
        nothing (it fails cleanly rather than leave the device full)."""
        self._memory_margin_bytes = _gm._size(value, "memory_margin_bytes")

    @property
    def retain_cpu_backup(self):
        return self._retain_cpu_backup

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        """Accepted for compatibility: gpumem always keeps the pinned host
        memory of a resumed tag in its host pool for the next pause."""
        if not isinstance(value, bool):
            raise TypeError("retain_cpu_backup must be True or False")
        self._retain_cpu_backup = value

    def get_cpu_backup(self, x, zero_copy=False):
        raise NotImplementedError("get_cpu_backup: gpumem does not hand out its host copies; "
                                  "read the tensor after resume()")

    def set_disk_backup_dir(self, path):
        raise NotImplementedError("set_disk_backup_dir: gpumem has no disk backup")

    def is_paused(self, tag):
        """Whether `tag` is paused now (False for a tag no region used)."""
        tag = _doors.check_name(tag, "is_paused", _NAME_ROOM)
        with _registry.lock:
            t = _registry.tags.get(tag)
            return bool(t and t.paused)

    def tag_info(self, tag):
        """gpumem's figures of a tag, both kinds summed over their pools:
        resident_blocks, resident_bytes, offloaded_blocks, offloaded_bytes,
        offloads, restores; paused; gpumem_tags (the names behind it)."""
        tag = _doors.check_name(tag, "tag_info", _NAME_ROOM)
        with _registry.lock:
            t = _registry.tags.get(tag)
            if t is None:
                raise _gm.InvalidArgumentError("tag_info: no region ever used tag %r" % tag)
            out = None
            for dt in t.parts():
                info = dt.info()
                out = info if out is None else {k: out[k] + info[k] for k in out}
            out["paused"] = t.paused
            out["gpumem_tags"] = [dt.tag.name for dt in t.parts()]
            return out


@contextlib.contextmanager
def configure_subprocess():
    """torch_memory_saver's LD_PRELOAD set-up for child processes: nothing to
    do here (gpumem works in-process through gpumem.torch; a child process
    calls gpumem.torch.enable() itself, or imports this door before CUDA
    initializes)."""
    yield


torch_memory_saver = TorchMemorySaver()
