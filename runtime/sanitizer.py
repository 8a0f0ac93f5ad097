"""The stream sanitizer (``NPUSIM_STREAM_CHECK``): names every unsynchronized cross-stream access.

Design note (torch's CUDA Stream Sanitizer, ``torch/cuda/_sanitizer.py``, adapted). Every stream
is a timeline whose values are its tasks' sequence numbers (``Stream.issued``); each device adds
one more timeline, the *host*, whose values count the host-synchronous accesses (``memcpy``,
``to_host``, ...). A *vector clock* per timeline says, for every other timeline, up to which value
its work is known to be finished before the timeline's next task starts:

- stream order: a task follows everything enqueued earlier on its stream;
- ``wait_event(ev)`` merges the clock the event captured at ``record``; ``wait_stream(o)`` merges
  ``o``'s clock and its last value;
- the host merges a stream's clock when it synchronizes it (an event's clock for
  ``Event.synchronize`` or a completed ``Event.query``), and every stream merges the host's clock
  before its next checked task: work enqueued after a synchronize follows what it waited for. A
  device synchronize orders everything before everything after, so it simply forgets the past.

Every checked task lists the byte ranges it reads and writes. A task at value ``n`` on timeline
``X`` happened before the current one when the current clock's entry for ``X`` is at least ``n``
(or ``X`` is the current timeline). An earlier access that overlaps a new one, where either
writes and neither happened before the other, is a race: reported at the *second* enqueue, before
anything is queued, as ``StreamRaceError`` (``warn`` mode logs and warns instead and goes on).

Memory stays bounded by the live allocations: the accesses of an allocation die with its free (a
free is itself checked as a write on the allocation's stream, the stream the caching pool orders
its reuse by: the record_stream problem), an access is dropped once a later one of its timeline's
successors covers it (a write covers anything it follows, a read covers reads it follows), and a
device synchronize drops them all. Clocks live per stream, event clocks as long as their event.

The nodes of a task graph are checked at every replay: the capture notes each node's reads and
writes (``access`` on a capturing stream), and ``replay`` checks them all as one task at the
replay's value, looking the buffers up again (one freed since the capture raises there).

Limits, by design: the host is one timeline per device (threads sharing a device are treated as
one host thread, as in CSAN); an enqueue racing another thread's enqueue on the same stream may
take its neighbour's sequence number (a missed report, never a false one); memory a kernel reaches
other than through its arguments or ``reads=``/``writes=`` is not seen.

The check observes the core through ``runtime.hooks``: enabled, this module is
``hooks.stream_check`` and the core calls the functions below on it; off, the hook point is
None and each costs the core one module-attribute test. The core never imports this module.
"""
from __future__ import annotations

import logging
import sys
import threading
import warnings
import weakref

from . import hooks
from .callsite import callsite
from .errors import InvalidParamError, StreamRaceError

log = logging.getLogger("runtime.sanitizer")

on = False                  # True while the check is enabled (and this is hooks.stream_check)
_mode = "raise"
# reentrant: the garbage collector may run a DeviceArray's finalizer, a free, inside a check on
# the same thread; that free is then only noted in _doomed and done when the check ends
_lock = threading.RLock()
_busy = False               # a check walks the accesses (only its thread can see it True)
_doomed: list = []          # (device id, base) of frees made during a check
_devices: dict = {}         # device id -> _Device
_clocks: dict = {}          # stream id -> vector clock {timeline id: value}
_seen: dict = {}            # stream id -> the host version its clock has merged
_events = weakref.WeakKeyDictionary()   # Event -> the clock it captured at record
_types: tuple = ()          # (DevicePtr, DeviceArray), bound at enable (they load numpy)
MODES = ("raise", "warn", "off")


class _Access:
    __slots__ = ("lo", "hi", "tl", "seq", "write", "task", "stream", "site")

    def __init__(self, lo, hi, tl, seq, write, task, stream, site):
        self.lo, self.hi, self.tl, self.seq, self.write = lo, hi, tl, seq, write
        self.task, self.stream, self.site = task, stream, site


class _Alloc:
    __slots__ = ("base", "size", "site", "accesses")

    def __init__(self, base, size, site):
        self.base, self.size, self.site, self.accesses = base, size, site, []


class _Device:
    """One device's host timeline and the accesses to its live allocations."""
    __slots__ = ("host", "host_seq", "host_vc", "host_ver", "allocs", "streams")

    def __init__(self, device_id: int):
        self.host = -(device_id + 1)    # stream ids start at 1: the host's id never collides
        self.host_seq = 0
        self.host_vc: dict = {}
        self.host_ver = 0
        self.allocs: dict = {}          # allocation base address -> _Alloc
        self.streams: set = set()       # ids of the streams with a clock (dropped with the device)


# ---------------------------------------------------------------------- switching
def enable_stream_check(mode="raise") -> None:
    """Turn the stream sanitizer on (``"raise"`` or True: a race raises StreamRaceError;
    ``"warn"``: it is logged and warned, and the work goes on) or off (``"off"``, False, None).

    Switching forgets every recorded access and clock. ``NPUSIM_STREAM_CHECK`` sets it at import.
    """
    global on, _mode, _types
    if mode is True:
        mode = "raise"
    elif mode is False or mode is None:
        mode = "off"
    if mode not in MODES:
        raise InvalidParamError(f"enable_stream_check(mode={mode!r}): expected one of {MODES}")
    from .array import DeviceArray
    from .memory import DevicePtr
    with _lock:
        _types = (DevicePtr, DeviceArray)
        _devices.clear()
        _clocks.clear()
        _seen.clear()
        _events.clear()
        _mode = mode
        on = mode != "off"
        hooks.stream_check = sys.modules[__name__] if on else None


def stream_check_enabled() -> bool:
    """True while the stream sanitizer is on (a library builds its access lists only then)."""
    return on


def declare_access(stream, name: str, *, site: str | None = None, reads=(), writes=()) -> None:
    """Declare what the task about to be enqueued on ``stream`` reads and writes.

    For libraries that enqueue their own tasks (hccl's collectives): call it just before
    ``stream.enqueue``. Items of ``reads`` / ``writes``: DeviceArray, DevicePtr (to the end of
    its allocation) or ``(buffer, nbytes)``. ``site`` names the enqueue's call site (the caller's
    when None). A no-op while the check is off.
    Raises StreamRaceError (the task must then not be enqueued), InvalidParamError for a bad item.
    """
    if on:
        if site is None:
            site = callsite(2)
        access(stream, name, site, reads, writes)


def forget(device_id: int) -> None:
    """Drop a device's state (``reset_device``)."""
    with _lock:
        d = _devices.pop(device_id, None)
        if d is not None:
            for sid in d.streams:
                _clocks.pop(sid, None)
                _seen.pop(sid, None)


def stats(device_id: int) -> dict:
    """What the check holds for a device: ``allocations`` and ``accesses`` recorded, ``clocks``
    (streams with a vector clock). Memory stays bounded by these (tests assert it)."""
    with _lock:
        d = _devices.get(device_id)
        if d is None:
            return {"allocations": 0, "accesses": 0, "clocks": 0}
        allocs = list(d.allocs.values())
        return {"allocations": len(allocs), "accesses": sum(len(a.accesses) for a in allocs),
                "clocks": len(d.streams)}


def _device(device_id: int) -> _Device:
    d = _devices.get(device_id)
    if d is None:
        d = _devices[device_id] = _Device(device_id)
    return d


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if dst.get(k, 0) < v:
            dst[k] = v


def _clock(d: _Device, s) -> dict:
    """Stream ``s``'s clock, with what its device's host has waited for merged in."""
    sid = s.id
    vc = _clocks.get(sid)
    if vc is None:
        vc = _clocks[sid] = {}
        d.streams.add(sid)
    if _seen.get(sid) != d.host_ver:
        _merge(vc, d.host_vc)
        if vc.get(d.host, 0) < d.host_seq:
            vc[d.host] = d.host_seq
        _seen[sid] = d.host_ver
    return vc


def _export(d: _Device, s, value: int) -> dict:
    """The clock of the point ``value`` on stream ``s``: what work waiting for it follows."""
    vc = dict(_clock(d, s))
    if vc.get(s.id, 0) < value:
        vc[s.id] = value
    return vc


# ---------------------------------------------------------------------- synchronization
def event_recorded(event, s, value: int) -> None:
    with _lock:
        _events[event] = _export(_device(s.device_id), s, value)


def _event_clock(event) -> dict | None:
    vc = _events.get(event)
    if vc is None and event.point is not None:     # recorded before the check was on
        src, value = event.point
        vc = {src.id: value}
    return vc


def stream_waits_event(s, event) -> None:
    with _lock:
        vc = _event_clock(event)
        if vc is not None:
            _merge(_clock(_device(s.device_id), s), vc)


def stream_waits_stream(s, other, value: int) -> None:
    with _lock:
        d = _device(s.device_id)
        _merge(_clock(d, s), _export(_device(other.device_id), other, value))


def _host_merge(d: _Device, vc: dict) -> None:
    _merge(d.host_vc, vc)
    d.host_ver += 1


def host_waits_stream(s, value: int) -> None:
    """The host waited for ``s`` up to ``value`` (Stream.synchronize)."""
    with _lock:
        d = _device(s.device_id)
        if d.host_vc.get(s.id, 0) >= value:
            return      # nothing enqueued on s since the host last waited for it: nothing new
        _merge(d.host_vc, _clock(d, s))   # in place: no copy of the clock on every synchronize
        d.host_vc[s.id] = value
        d.host_ver += 1


def host_waits_event(event) -> None:
    """The host saw ``event`` complete (Event.synchronize, a True Event.query)."""
    point = event.point
    if point is None:
        return
    with _lock:
        vc = _event_clock(event)
        _host_merge(_device(point[0].device_id), vc)


def device_synchronized(device_id: int) -> None:
    """Every stream of the device is idle: no earlier access can race a later one."""
    with _lock:
        d = _devices.get(device_id)
        if d is not None:
            d.allocs.clear()


# ---------------------------------------------------------------------- accesses
def _span(buf, nbytes, what: str):
    """(allocation base, size, site, lo, hi) of the bytes ``buf`` names; None when it has none."""
    ptr_t, arr_t = _types
    if isinstance(buf, tuple) and len(buf) == 2:
        buf, nbytes = buf
    if isinstance(buf, arr_t):
        if buf.nbytes == 0 or buf.ptr is None:
            return None
        ptr = buf.device_ptr(what)
        n = buf.nbytes if nbytes is None else nbytes
    elif isinstance(buf, ptr_t):
        ptr, n = buf, nbytes
    else:
        raise InvalidParamError(f"{what}={buf!r}: expected a DeviceArray, a DevicePtr or a "
                                "(buffer, nbytes) pair")
    base, size, site = ptr.allocation()
    lo = ptr.addr
    hi = base + size if n is None else lo + n
    return base, size, site, lo, min(hi, base + size)


def _spans(reads, writes, task=None, site=None):
    """``(span, write, task, site)`` of every buffer of ``reads`` / ``writes`` that has bytes."""
    out = []
    for bufs, write, what in ((writes, True, "writes"), (reads, False, "reads")):
        for b in bufs:
            sp = _span(b, None, what)
            if sp is not None:
                out.append((sp, write, task, site))
    return out


def access(s, task: str, site: str, reads=(), writes=()) -> None:
    """Check and record the accesses of a task about to be enqueued on stream ``s``.

    ``reads`` / ``writes``: DeviceArray, DevicePtr (to the end of its allocation) or
    ``(buffer, nbytes)`` items. Raises StreamRaceError (mode ``raise``) before anything is queued.
    """
    if s.capture is not None:       # a node of a task graph: checked at each replay
        _spans(reads, writes)       # a bad item raises at the capture
        s.capture.note_access(task, site, reads, writes)
        return
    spans = _spans(reads, writes, task, site)
    if not spans:
        return
    with _lock:
        d = _device(s.device_id)
        _check(d, spans, s.id, s.issued + 1, _clock(d, s), s.name)


def replay(s, accesses, site: str) -> None:
    """Check and record the accesses of a graph replay about to be enqueued on ``s``: every
    node's, as noted at the capture (``(task, capture site, reads, writes)``), as one task at the
    replay's value; the nodes run one after the other in it, so they never race each other.
    The buffers are looked up again: one freed since the capture raises use after free here.
    Raises StreamRaceError (mode ``raise``) before anything is queued."""
    spans = []
    for task, where, reads, writes in accesses:
        spans += _spans(reads, writes, task, f"{where} (node; replayed at {site})")
    if not spans:
        return
    with _lock:
        d = _device(s.device_id)
        _check(d, spans, s.id, s.issued + 1, _clock(d, s), s.name)


def host_access(s, task: str, site: str, reads=(), writes=()) -> None:
    """A host-synchronous call on stream ``s``: the host waits for ``s``, then accesses."""
    spans = _spans(reads, writes, task, site)
    with _lock:
        d = _device(s.device_id)
        _host_merge(d, _export(d, s, s.issued))
        if spans:
            d.host_seq += 1
            _check(d, spans, d.host, d.host_seq, d.host_vc, "the host")


def freeing(device_id: int, base: int, s, site: str, from_gc: bool, after=()) -> None:
    """A free of the allocation at ``base`` made last on stream ``s`` (the pool reuses it in
    ``s``'s order): a write of all of it there, ordered also after the work already enqueued on
    the streams of ``after`` (``record_stream``: the pool waits for it). Its accesses die with
    it unless it raises.

    A free by the garbage collector cannot raise to the user: it is logged and warned (not at
    interpreter exit, where pending work is abandoned anyway), then done."""
    with _lock:
        if _busy:
            _doomed.append((device_id, base))
            return
        d = _devices.get(device_id)
        alloc = d.allocs.get(base) if d is not None else None
        if alloc is None:
            return
        task = "free by the garbage collector" if from_gc else "free"
        span = ((base, alloc.size, alloc.site, base, base + alloc.size), True, task, site)
        vc = _clock(d, s)
        if after:
            vc = dict(vc)
            for u in after:
                _merge(vc, _export(d, u, u.issued))
        try:
            _check(d, [span], s.id, s.issued + 1, vc, s.name, True)
        except StreamRaceError as err:
            if not from_gc:
                raise           # nothing freed: the caller may synchronize and free again
            if not sys.is_finalizing():
                log.error("%s", err)
                warnings.warn(str(err), RuntimeWarning, stacklevel=2)
        d.allocs.pop(base, None)


def _check(d, spans, tl, seq, vc, stream, free=False) -> None:
    """Check ``spans`` against the recorded accesses, then record them (the caller holds _lock).

    Nothing is recorded when the check raises: the task is not enqueued."""
    global _busy
    _busy = True
    try:
        _check_locked(d, spans, tl, seq, vc, stream, free)
    finally:
        _busy = False
        while _doomed:
            dev, base = _doomed.pop()
            gone = _devices.get(dev)
            if gone is not None:
                gone.allocs.pop(base, None)


def _check_locked(d, spans, tl, seq, vc, stream, free) -> None:
    reports, new = [], {}           # allocation base -> (its _Alloc, its accesses afterwards)
    for (base, size, asite, lo, hi), write, task, site in spans:
        alloc, accesses = new.get(base) or (d.allocs.get(base), None)
        if alloc is None or alloc.size != size:
            alloc, accesses = _Alloc(base, size, asite), []
        keep = []
        for a in alloc.accesses if accesses is None else accesses:
            if a.hi <= lo or a.lo >= hi:
                keep.append(a)
                continue
            ordered = a.tl == tl or vc.get(a.tl, 0) >= a.seq
            if not ordered and (write or a.write):
                reports.append(_report(alloc, a, max(lo, a.lo), min(hi, a.hi), write, task,
                                       stream, site, free))
            elif ordered and (write or not a.write):
                # superseded where the new access covers it (anything racing that part races
                # the new access too): only the parts sticking out are kept
                if a.lo < lo:
                    keep.append(_Access(a.lo, lo, a.tl, a.seq, a.write, a.task, a.stream, a.site))
                if a.hi > hi:
                    keep.append(_Access(hi, a.hi, a.tl, a.seq, a.write, a.task, a.stream, a.site))
                continue
            keep.append(a)
        keep.append(_Access(lo, hi, tl, seq, write, task, stream, site))
        new[base] = (alloc, keep)
    if reports:
        if _mode == "raise":
            raise reports[0]
        for err in reports:
            log.error("%s", err)
            warnings.warn(str(err), RuntimeWarning, stacklevel=4)
    if not free:
        for base, (alloc, keep) in new.items():
            alloc.accesses = keep
            d.allocs[base] = alloc


def _report(alloc, first, lo, hi, write, task, stream, site, free) -> StreamRaceError:
    kind1 = "write" if first.write else "read"
    kind2 = "free" if free else "write" if write else "read"
    if free:
        what = (f"{task} of the allocation on {stream} (the pool reuses the memory in that "
                f"stream's order) while '{first.task}' on {first.stream} may still {kind1} it")
        fix = (f"{stream}.wait_stream({first.stream}) (or wait_event) or synchronize "
               f"{first.stream} before the free")
    else:
        what = (f"'{task}' on {stream} {kind2}s {hi - lo} bytes that '{first.task}' on "
                f"{first.stream} {kind1}s, with nothing ordering the two")
        fix = (f"record an event on {first.stream} after '{first.task}' and make {stream} wait "
               f"for it (wait_event), or {stream}.wait_stream({first.stream}), or synchronize "
               f"{first.stream} before enqueueing '{task}'")
    msg = (f"stream race: {what}\n"
           f"  buffer: 0x{lo:x}..0x{hi:x} ({hi - lo} bytes at offset {lo - alloc.base} of the "
           f"{alloc.size}-byte allocation at 0x{alloc.base:x}, allocated at {alloc.site})\n"
           f"  first:  {kind1} by '{first.task}' on {first.stream}, enqueued at {first.site}\n"
           + (f"  second: {task} on {stream}, called at {site}\n" if free else
              f"  second: {kind2} by '{task}' on {stream}, enqueued at {site}\n") +
           f"  fix: {fix}")
    return StreamRaceError(msg, address=lo, nbytes=hi - lo, alloc_base=alloc.base,
                           alloc_size=alloc.size, alloc_site=alloc.site,
                           first_task=first.task, first_stream=first.stream,
                           first_site=first.site, first_access=kind1, second_task=task,
                           second_stream=stream, second_site=site, second_access=kind2)
