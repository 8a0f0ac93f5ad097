"""Chrome-trace / Perfetto JSON of every task, one track per stream; steps, ranges, memory.

Timestamps are wall-clock microseconds (a perf_counter offset pinned to time.time() at import), so
traces written by the ranks of one node line up when merged.

What a trace holds beyond the tasks' "X" events (``launcher.profsummary`` reads it, see
docs/profiling.md):

- each task's call site (``args.site``), its timeline value on its stream (``args.task``), the
  CPU time of the thread that ran it (``args.cpu_us``) and that thread's *run delay* over the
  task (``args.delay_us``: the time it was ready to run but waited for a core, Linux's
  per-thread schedstat, second field). In a simulation a kernel's wall time also holds the
  time its thread was descheduled; less its run delay, it is the time the task held its stream
  on the device, whether it computed or waited (a sleep, a simulated latency). Each thread
  keeps its ``/proc/thread-self/schedstat`` open and reads it once at a task's start and once
  at its end, only while a recording is on; the CPU time is ``time.thread_time`` (schedstat's
  own CPU field lags by up to a scheduler tick). Without schedstat there is no run delay;
- ``step()`` marks ("i" events named ``step mark``) with every stream's last issued timeline value
  at the mark (and the marking thread's run delay so far, ``args.delay_us``), so the summary attributes each task to the step whose host code enqueued it, and
  "X" events ``step N`` between consecutive marks on the host track (tid 0);
- ``range(name)`` blocks as "X" events on the host track;
- each device's allocated and reserved bytes as counter events ("C", ``NPU<d> memory``), sampled
  when a task ends at most every MEMORY_SAMPLE_US and at each mark, written only when they
  changed, and the pools' peaks in the file's ``npusim`` object.

The profiler observes the core through ``runtime.hooks``: while a recording is on this module is
``hooks.profiler`` (the streams time their tasks through ``task_start`` / ``task_end``), and
from its import on it names each new stream's track (``hooks.stream_created``). The core never
imports it.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time

from . import config, hooks
from .current import contexts_by_device

_P0 = time.perf_counter()
_W0 = time.time()
_perf = time.perf_counter
_cpu = time.thread_time
_lock = threading.Lock()
_sinks: tuple = ()                # one list of event tuples per active recording
on = False                        # bool(_sinks), read on every task and call: no call to ask
_tracks: dict[int, str] = {}      # track id -> name

HOST_TRACK = 0                    # step marks and ranges (stream ids start at 1)
MEMORY_SAMPLE_US = 1000.0         # at most one memory sample per millisecond of task ends
_MARK, _COUNTER = "step mark", "memory"   # categories of the non-task records
_mem_next = 0.0                   # trace time of the next memory sample
_mem_last: dict[int, tuple] = {}  # device -> (allocated, reserved) last recorded
_marks = 0                        # step() calls so far in this process


def now_us() -> float:
    """Wall-clock microseconds on the trace clock."""
    return (_W0 + (_perf() - _P0)) * 1e6


def active() -> bool:
    return bool(_sinks)


def register_track(track: int, name: str) -> None:
    _tracks[track] = name


def _name_track(stream) -> None:
    """``hooks.stream_created``: a stream's track is named after its device and name."""
    _tracks[stream.id] = f"NPU{stream.device_id} {stream.name}"


def _attach() -> None:
    """Name the tracks of the streams made before this module was imported, and of every
    stream made from now on (``hooks.stream_created``)."""
    if _name_track not in hooks.stream_created:
        hooks.stream_created.append(_name_track)
    for ctx in list(contexts_by_device.values()):
        for s in list(ctx.streams):
            _name_track(s)


def _emit(ev: tuple) -> None:
    for sink in _sinks:            # recordings nest: a profile() block inside NPUSIM_PROFILE_DIR
        sink.append(ev)


def record(track: int, name: str, cat: str, start_us: float, end_us: float, args=None,
           site: str | None = None, task: int | None = None, cpu_us: float | None = None,
           delay_us: float | None = None) -> None:
    """One task (or host-synchronous operation) that ran from ``start_us`` to ``end_us``;
    ``cpu_us`` / ``delay_us``: its thread's CPU time and run delay over it, when known."""
    if args:
        args = dict(args)          # a replayed graph node's meta dict is shared by its replays
    _emit((track, name, cat, start_us, end_us, args, site, task, cpu_us, delay_us))
    if end_us >= _mem_next:
        _sample_memory(end_us)


class _SchedFile:
    """The calling thread's ``/proc/thread-self/schedstat``, open once per thread (the path
    names the thread that opened it); closed when the thread's locals go, at its exit."""

    __slots__ = ("fd",)

    def __init__(self):
        self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self):
        try:
            os.close(self.fd)
        except OSError:
            pass


class _SchedLocal(threading.local):
    file: "_SchedFile | None | bool" = None     # False: no schedstat here


_sched_tls = _SchedLocal()


def _run_delay() -> int | None:
    """The calling thread's run delay in ns (one pread of its kept schedstat); None where
    the kernel has no per-thread schedstat."""
    f = _sched_tls.file
    if f is None:
        try:
            f = _sched_tls.file = _SchedFile()
        except OSError:
            f = _sched_tls.file = False
    if f is False:
        return None
    try:
        return int(os.pread(f.fd, 64, 0).split()[1])
    except (OSError, ValueError, IndexError):
        _sched_tls.file = False
        return None


def _forget_sched_files() -> None:
    """In a forked child: the inherited descriptors name the parent's threads."""
    global _sched_tls
    _sched_tls = _SchedLocal()


os.register_at_fork(after_in_child=_forget_sched_files)


def task_start() -> tuple:
    """What a stream takes before running a task it records: (trace time, thread CPU time,
    thread run delay in ns or None)."""
    return now_us(), _cpu(), _run_delay()


def task_end(began: tuple, track: int, name: str, cat: str, args, site, task) -> None:
    """Record a task that began at ``began`` (``task_start()``) and ends now, with its thread's
    CPU time and run delay over it."""
    delay = _run_delay()
    cpu = (_cpu() - began[1]) * 1e6
    end = now_us()
    d = None if delay is None or began[2] is None else (delay - began[2]) * 1e-3
    record(track, name, cat, began[0], end, args, site, task, cpu, d)


def _sample_memory(t: float) -> None:
    """Counter records of every device's allocated / reserved bytes that changed since the last."""
    global _mem_next
    _mem_next = t + MEMORY_SAMPLE_US
    for dev, ctx in list(contexts_by_device.items()):
        pool = ctx.pool
        now = (pool.allocated, pool.reserved)
        if _mem_last.get(dev) != now:
            _mem_last[dev] = now
            _emit((HOST_TRACK, f"NPU{dev} memory", _COUNTER, t, t,
                   {"allocated": now[0], "reserved": now[1]}, None, None, None, None))


def step() -> None:
    """Mark a step boundary (as torch.profiler's ``prof.step()``): call it once per iteration.

    Step N is the work enqueued between marks N-1 and N, so N marks make N-1 steps; what comes
    before the first mark (set-up, warm-up) and after the last is no step. The summary measures a
    step on the device timeline: from the end of the previous step's work to the end of its own.
    Costs nothing when no recording is active.
    """
    global _marks
    if not _sinks:
        return
    issued = {str(s.id): s.issued for ctx in list(contexts_by_device.values())
              for s in list(ctx.streams)}
    t = now_us()
    with _lock:
        n, _marks = _marks, _marks + 1
    args = {"mark": n, "issued": issued}
    delay = _run_delay()            # the host thread's waits for a core so far (the summary
    if delay is not None:           # takes them out of its host time between tasks)
        args["delay_us"] = round(delay * 1e-3, 1)
    _emit((HOST_TRACK, "step mark", _MARK, t, t, args, None, None, None, None))
    _sample_memory(t)


@contextlib.contextmanager
def range(name: str):  # noqa: A001 - torch's record_function / nvtx range, by its usual name
    """Show the block as a span named ``name`` on the host track of the trace (nesting is fine).

    Costs nothing when no recording is active.
    """
    if not _sinks:
        yield
        return
    t0 = now_us()
    try:
        yield
    finally:
        _emit((HOST_TRACK, str(name), "range", t0, now_us(), None, None, None, None, None))


def _process_label() -> tuple[int, str]:
    rank = config.rank()
    if rank is not None:
        return rank, f"rank {rank}"
    return os.getpid(), f"pid {os.getpid()}"


def _peaks() -> dict:
    return {str(dev): {"allocated": ctx.pool.max_allocated, "reserved": ctx.pool.max_reserved}
            for dev, ctx in list(contexts_by_device.items())}


def _dump(path: str, events: list) -> None:
    pid, label = _process_label()
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}},
           {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
            "args": {"sort_index": pid}}]
    tracks = dict(_tracks)
    tracks[HOST_TRACK] = "host (steps, ranges)"
    for track, tname in sorted(tracks.items()):
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": track,
                    "args": {"name": tname}})
    last_mark = None
    for track, name, cat, t0, t1, args, site, task, cpu, delay in events:
        if cat == _COUNTER:
            out.append({"name": name, "ph": "C", "pid": pid, "tid": track, "ts": round(t0, 3),
                        "args": args})
            continue
        if cat == _MARK:
            out.append({"name": name, "cat": cat, "ph": "i", "s": "p", "pid": pid, "tid": track,
                        "ts": round(t0, 3), "args": args})
            if last_mark is not None:      # the host's view of the step, for the timeline
                out.append({"name": f"step {args['mark']}", "cat": "step", "ph": "X", "pid": pid,
                            "tid": track, "ts": round(last_mark, 3),
                            "dur": round(t0 - last_mark, 3)})
            last_mark = t0
            continue
        ev = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": track,
              "ts": round(t0, 3), "dur": round(max(t1 - t0, 0.0), 3)}
        if args or site or task is not None:
            a = dict(args) if args else {}
            if site:
                a["site"] = site
            if task is not None:
                a["task"] = task
            if cpu is not None:
                a["cpu_us"] = round(cpu, 1)
            if delay is not None:
                a["delay_us"] = round(delay, 1)
            ev["args"] = a
        out.append(ev)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": out, "displayTimeUnit": "ms",
                   "npusim": {"memory_peak": _peaks()}}, f)
    os.replace(tmp, path)


def start() -> list:
    """Begin a recording; returns its sink (pass it to ``stop_and_write``)."""
    global _sinks, _mem_next, on
    sink: list = []
    with _lock:
        _sinks = _sinks + (sink,)
        on = True
        hooks.profiler = sys.modules[__name__]
        _mem_last.clear()          # the new recording starts with a sample of each device
        _mem_next = 0.0
    return sink


def stop_and_write(sink: list, path: str) -> None:
    """End the recording ``sink`` and write what it recorded (pending tasks are not waited for)."""
    global _sinks, on
    try:
        _sample_memory(now_us())
    except Exception:  # noqa: BLE001 - a device reset mid-way must not cost the trace
        pass
    with _lock:
        _sinks = tuple(s for s in _sinks if s is not sink)
        on = bool(_sinks)
        hooks.profiler = sys.modules[__name__] if on else None
    _dump(path, sink)


@contextlib.contextmanager
def profile(path: str):
    """Record every task of every stream in the block and write a Chrome trace to ``path``.

    Streams are synchronized at the end of the block so the trace holds all the work issued in it.
    """
    from .context import synchronize_all
    sink = start()
    try:
        yield
    finally:
        try:
            synchronize_all()
        finally:
            stop_and_write(sink, path)


_env_started = False


def env_profile() -> None:
    """Start NPUSIM_PROFILE_DIR's trace of this process, once, when its first device context is
    made (runtime.set_device), not at import: npurun's fork server imports runtime with rank 0's
    environment before it forks the ranks, and a trace begun there would name every rank 0."""
    global _env_started
    if _env_started:
        return
    _env_started = True
    d = config.profile_dir()
    if not d:
        return
    sink = start()
    pid, _ = _process_label()
    path = os.path.join(d, f"trace_{'rank' if config.rank() is not None else 'pid'}{pid}.json")

    def _write():
        try:
            from .context import synchronize_all
            synchronize_all()
        except Exception:  # a failed task must not cost the trace
            pass
        stop_and_write(sink, path)
    atexit.register(_write)


_attach()
