"""Chrome-trace / Perfetto JSON of every task, one track per stream.

Timestamps are wall-clock microseconds (a perf_counter offset pinned to time.time() at import), so
traces written by the ranks of one node line up when merged.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time

from . import config

_P0 = time.perf_counter()
_W0 = time.time()
_lock = threading.Lock()
_sinks: tuple = ()                # one list of event tuples per active recording
_tracks: dict[int, str] = {}      # track id -> name


def now_us() -> float:
    """Wall-clock microseconds on the trace clock."""
    return (_W0 + (time.perf_counter() - _P0)) * 1e6


def active() -> bool:
    return bool(_sinks)


def register_track(track: int, name: str) -> None:
    _tracks[track] = name


def record(track: int, name: str, cat: str, start_us: float, end_us: float, args=None) -> None:
    ev = (track, name, cat, start_us, end_us, args)
    for sink in _sinks:            # recordings nest: a profile() block inside NPUSIM_PROFILE_DIR
        sink.append(ev)


def _process_label() -> tuple[int, str]:
    rank = config.rank()
    if rank is not None:
        return rank, f"rank {rank}"
    return os.getpid(), f"pid {os.getpid()}"


def _dump(path: str, events: list) -> None:
    pid, label = _process_label()
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}},
           {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
            "args": {"sort_index": pid}}]
    for track, tname in sorted(_tracks.items()):
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": track,
                    "args": {"name": tname}})
    for track, name, cat, t0, t1, args in events:
        ev = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": track,
              "ts": round(t0, 3), "dur": round(max(t1 - t0, 0.0), 3)}
        if args:
            ev["args"] = args
        out.append(ev)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": out, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)


def start() -> list:
    """Begin a recording; returns its sink (pass it to ``stop_and_write``)."""
    global _sinks
    sink: list = []
    with _lock:
        _sinks = _sinks + (sink,)
    return sink


def stop_and_write(sink: list, path: str) -> None:
    """End the recording ``sink`` and write what it recorded (pending tasks are not waited for)."""
    global _sinks
    with _lock:
        _sinks = tuple(s for s in _sinks if s is not sink)
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


def _env_profile() -> None:
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


_env_profile()
