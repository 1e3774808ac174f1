# SPDX-License-Identifier: Apache-2.0
"""gpumem.vllm — vLLM's sleep-mode allocator calls, on gpumem tags and offload.

Code written for vLLM's CuMemAllocator switches with its import:

    from gpumem.vllm import CuMemAllocator      # was: from vllm.device_allocator.cumem import ...

    allocator = CuMemAllocator.get_instance()   # one per process
    with allocator.use_memory_pool(tag="weights"):
        model = build().cuda()                  # this thread's CUDA memory carries the tag
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.empty(..., device="cuda")
    allocator.sleep(offload_tags=("weights",))  # weights to host memory, the KV cache discarded
    allocator.wake_up(tags=["weights"])         # same addresses, same bytes
    allocator.wake_up(tags=["kv_cache"])        # same addresses, contents undefined

Each door tag is the gpumem tag "vllm/<tag>" (gpumem.tag_info works on it).
sleep(level=1) / sleep(level=2) are what vLLM's GPU worker asks for its
levels: keep "weights", or keep nothing.  PyTorch's tensors reach gpumem
only under gpumem.torch: use_memory_pool enables it when CUDA is not
initialized yet and raises otherwise (docs/sleep.md).

Misuse raises: SleepStateError (sleep while asleep, wake_up while awake, a
tag that is awake already) and gpumem.InvalidArgumentError (a tag this
allocator never saw, a bad level); nothing changes then.
"""
import contextlib

import gpumem as _gm
from . import _doors
from ._doors import SleepStateError

__all__ = ["CuMemAllocator", "SleepStateError", "TAG_PREFIX"]

TAG_PREFIX = "vllm/"
_NAME_ROOM = _gm._TAG_NAME_MAX - len(TAG_PREFIX)
_LEVEL_KEEPS = {1: ("weights",), 2: ()}   # vLLM's GPU worker: what each sleep level keeps
_singleton_lock = _doors.new_lock()


def _tag_list(tags, what):
    """None, a str or an iterable of str -> a list without repeats (or None)."""
    if tags is None:
        return None
    if isinstance(tags, str):
        tags = (tags,)
    if not isinstance(tags, (tuple, list, set, frozenset)):
        raise TypeError("%s: tags must be a str or a tuple/list/set of str, not %s"
                        % (what, type(tags).__name__))
    out = []
    for t in tags:
        _doors.check_name(t, what, _NAME_ROOM)
        if t not in out:
            out.append(t)
    return out


class CuMemAllocator:
    """vLLM's sleep-mode allocator, on gpumem.  One per process: get_instance().

    use_memory_pool(tag) tags what the calling thread allocates inside it.
    sleep() puts every tag this allocator has seen to sleep: those named in
    offload_tags keep their contents in pinned host memory, the others are
    discarded; every device page they held goes back (pages shared with
    memory outside the tags stay).  wake_up() maps pages at the same
    addresses: kept tags get their bytes back, discarded ones get memory
    whose contents are undefined (not zeroed: rebuild it, as vLLM does)."""

    instance = None          # the process's allocator (vLLM's class attribute)
    default_tag = "default"

    @staticmethod
    def get_instance():
        """The process's allocator, made on first call."""
        with _singleton_lock:
            if CuMemAllocator.instance is None:
                CuMemAllocator()
            return CuMemAllocator.instance

    def __init__(self):
        with _singleton_lock:
            if CuMemAllocator.instance is not None:
                raise SleepStateError("CuMemAllocator is one per process: use "
                                      "CuMemAllocator.get_instance()")
            self._lock = _doors.new_lock()
            self._tags = {}          # door tag -> _doors.DoorTag, in the order first used
            self._asleep = {}        # door tag -> kept (bool), for the tags asleep now
            self._sleeping = False
            CuMemAllocator.instance = self

    # ---- tags --------------------------------------------------------------

    def _door_tag(self, name):
        with self._lock:
            dt = self._tags.get(name)
            if dt is None:
                dt = _doors.DoorTag(name, _gm.tag(TAG_PREFIX + name, discard=False))
                self._tags[name] = dt
            return dt

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        """Inside the block, this thread's CUDA allocations carry `tag`
        (default_tag when None), in the pool of the current device."""
        if tag is None:
            tag = CuMemAllocator.default_tag
        _doors.check_name(tag, "use_memory_pool", _NAME_ROOM)
        _doors.route_allocations("CuMemAllocator.use_memory_pool")
        dt = self._door_tag(tag)
        with dt.scope():
            yield

    # ---- sleep and wake ------------------------------------------------------

    def sleep(self, offload_tags=None, level=None):
        """Put every tag to sleep.  offload_tags (a str or a tuple of str;
        None: (default_tag,)) keep their contents in pinned host memory; the
        others are discarded.  level=1 or 2 instead chooses what vLLM's GPU
        worker does: keep ("weights",), or keep nothing.  Raises
        SleepStateError when asleep already.  A failure while kept tags are
        copied out wakes what this call put to sleep and raises (nothing
        lost); then the cached memory of the tags' pools goes back (vLLM's
        empty_cache)."""
        if level is not None:
            if offload_tags is not None:
                raise _gm.InvalidArgumentError("sleep: give offload_tags or level, not both")
            if isinstance(level, bool) or level not in _LEVEL_KEEPS:
                raise _gm.InvalidArgumentError("sleep: level must be 1 (keep the weights) or 2 "
                                               "(keep nothing), got %r" % (level,))
            keep = list(_LEVEL_KEEPS[level])
        else:
            keep = _tag_list(offload_tags, "sleep") if offload_tags is not None else [self.default_tag]
        with self._lock:
            if self._sleeping:
                raise SleepStateError("sleep(): the allocator is asleep already (tags asleep: %s); "
                                      "wake_up() first" % (", ".join(sorted(self._asleep)) or "none"))
            names = list(self._tags)
            kept = [n for n in names if n in keep]
            dropped = [n for n in names if n not in keep]
            started = []
            try:
                for n in kept:
                    started.append(n)
                    self._tags[n].offload(discard=False)
            except BaseException as e:
                for n in started:            # back as it was: restore what moved
                    try:
                        self._tags[n].restore()
                    except Exception as again:  # noqa: BLE001 -- the first error is the one raised
                        _doors.note(e, "and waking tag %r back failed: %s" % (n, again))
                raise
            self._sleeping = True
            self._asleep = {n: n in keep for n in names}
            # Discarding moves no data: nothing to undo if it fails, and the
            # allocator is asleep from here on (wake_up brings every tag back).
            for n in dropped:
                self._tags[n].offload(discard=True)
            _doors.trim_pools(self._tags.values())

    def prepare_sleep(self, offload_tags=None, background=True):
        """(gpumem's own, not vLLM's) Pin now the host memory that sleep()
        will copy offload_tags into (as sleep() reads them), so that the
        first sleep runs at the speed of later ones; background=True returns
        at once (the sleep waits for it).  The memory stays pinned for later
        sleeps.  Call it once the weights are loaded."""
        if not isinstance(background, bool):
            raise TypeError("prepare_sleep: background must be True or False")
        keep = _tag_list(offload_tags, "prepare_sleep") if offload_tags is not None else [self.default_tag]
        with self._lock:
            for n in keep:
                if n in self._tags:
                    self._tags[n].prepare(background)

    def wake_up(self, tags=None):
        """Wake the tags named (a str or a list of str; None: every tag
        asleep): pages mapped at the same addresses, kept tags' bytes copied
        back.  Raises SleepStateError when not asleep or when a named tag is
        awake, InvalidArgumentError for a tag never used.  All or nothing:
        if one tag cannot get its pages, those this call woke go back to
        sleep and the error is raised (the allocator stays asleep)."""
        names = _tag_list(tags, "wake_up")
        with self._lock:
            if not self._sleeping:
                raise SleepStateError("wake_up(): the allocator is not asleep")
            if names is None:
                names = list(self._asleep)
            for n in names:
                if n not in self._tags:
                    raise _gm.InvalidArgumentError("wake_up: no memory was ever allocated under tag %r "
                                                   "(tags: %s)" % (n, ", ".join(self._tags) or "none"))
                if n not in self._asleep:
                    raise SleepStateError("wake_up: tag %r is awake already (asleep: %s)"
                                          % (n, ", ".join(self._asleep) or "none"))
            woken = []                       # (name, pools woken)
            try:
                for n in names:
                    try:
                        woken.append((n, self._tags[n].restore()))
                    except _gm.GpumemError as e:
                        woken.append((n, getattr(e, "pools_done", [])))
                        raise
            except BaseException as e:
                for n, pools in woken:       # back to sleep, as before the call
                    dt = self._tags[n]
                    for pool in pools:
                        try:
                            _only(dt, pool).offload(discard=not self._asleep[n])
                        except Exception as again:  # noqa: BLE001 -- the first error is the one raised
                            _doors.note(e, "and putting tag %r back to sleep failed: %s" % (n, again))
                raise
            for n in names:
                del self._asleep[n]
            if not self._asleep:
                self._sleeping = False

    # ---- figures -------------------------------------------------------------

    def get_current_usage(self):
        """Bytes allocated under this allocator's tags, asleep or awake."""
        with self._lock:
            total = 0
            for dt in self._tags.values():
                info = dt.info()
                total += info["resident_bytes"] + info["offloaded_bytes"]
            return total

    @property
    def is_sleeping(self):
        """Whether a sleep() has not been woken whole yet."""
        return self._sleeping

    @property
    def sleeping_tags(self):
        """The tags asleep now."""
        with self._lock:
            return frozenset(self._asleep)

    def tag_info(self, tag):
        """gpumem's figures of a tag, summed over its pools: resident_blocks,
        resident_bytes, offloaded_blocks, offloaded_bytes, offloads, restores;
        asleep and kept (whether its contents survive the sleep)."""
        _doors.check_name(tag, "tag_info", _NAME_ROOM)
        with self._lock:
            dt = self._tags.get(tag)
            if dt is None:
                raise _gm.InvalidArgumentError("tag_info: no memory was ever allocated under tag %r" % tag)
            out = dt.info()
            out["asleep"] = tag in self._asleep
            out["kept"] = self._asleep.get(tag, True)
            out["gpumem_tag"] = dt.tag.name
            return out


def _only(dt, pool):
    """A view of dt limited to one pool (for undoing a partial wake)."""
    view = _doors.DoorTag(dt.name, dt.tag)
    view.pools = {pool: dt.pools[pool]}
    return view
