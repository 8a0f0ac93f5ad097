"""Take every live rank's Python stacks now, without the ranks' cooperation.

Each worker registered ``faulthandler`` for SIGUSR1 on its stack file (``launcher.worker``); the
handler runs at C level, without the GIL, so it answers even when the rank is stuck in a
collective, a lock or a C call. We note each file's size, send SIGUSR1 to each worker process (not
its group: its children have no such handler and SIGUSR1 would kill them), and read what was
appended once the file stops growing.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Protocol

SETTLE = 0.05  # a dump is complete once its file has not grown for this long


class _Rank(Protocol):
    rank: int

    def alive(self) -> bool: ...
    def signal_process(self, sig: int) -> bool: ...


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def collect(ranks: Iterable[tuple[_Rank, str]], timeout: float = 2.0) -> dict[int, str]:
    """Dump the stacks of every live rank; ``ranks`` yields (worker, its stack file path).

    Returns {rank: text}. A rank that cannot dump (not a Python worker, not yet started, died)
    maps to a one-line explanation in angle brackets instead of a stack.
    """
    out: dict[int, str] = {}
    asked: dict[int, tuple[str, int]] = {}
    for w, path in ranks:
        if not w.alive():
            out[w.rank] = "<exited>"
            continue
        start = _size(path)
        if start < 0:  # the file appears only once the SIGUSR1 handler is in place
            out[w.rank] = "<no stack dump: the rank is still starting or is not a Python worker>"
            continue
        if w.signal_process(signal.SIGUSR1):
            asked[w.rank] = (path, start)
        else:
            out[w.rank] = "<exited>"
    last: dict[int, tuple[int, float]] = {}
    deadline = time.monotonic() + timeout
    while asked:
        now = time.monotonic()
        for rank, (path, start) in list(asked.items()):
            size = _size(path)
            prev = last.get(rank)
            if size > start and prev and prev[0] == size and now - prev[1] >= SETTLE:
                with open(path, "rb") as f:
                    f.seek(start)
                    out[rank] = f.read(size - start).decode("utf-8", "replace")
                del asked[rank]
            elif not prev or prev[0] != size:
                last[rank] = (size, now)
        if now >= deadline:
            break
        time.sleep(0.01)  # bounded: at most timeout / 10 ms polls of a few stat() calls
    for rank in asked:
        out[rank] = f"<no answer to SIGUSR1 within {timeout:g} s>"
    return out
