"""Take every live rank's Python stacks now, without the ranks' cooperation.

Each worker dumps every thread's stack to its stack file on SIGUSR1 (``launcher.worker``): a
Python handler, which the main thread runs at its next bytecode, also when it waits in a
collective, a lock or a sleep (the signal interrupts the wait). We note each file's size, send
SIGUSR1 to each worker process (not its group: its children have no such handler and the signal
would kill them), and read what was appended once the file stops growing. A rank whose file has
not grown after FALLBACK seconds has a main thread stuck in C; it gets SIGUSR2, faulthandler's
dump from the C signal handler, which needs no Python but reads the other threads' frames while
they may run (the reason it is not the first choice, see the worker's docstring).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Protocol

SETTLE = 0.05  # a dump is complete once its file has not grown for this long
FALLBACK = 0.5  # SIGUSR1 unanswered this long: SIGUSR2 (at most a third of the timeout)


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
    asked: dict[int, tuple[_Rank, str, int]] = {}
    for w, path in ranks:
        if not w.alive():
            out[w.rank] = "<exited>"
            continue
        start = _size(path)
        if start < 0:  # the file appears only once the handlers are in place
            out[w.rank] = "<no stack dump: the rank is still starting or is not a Python worker>"
            continue
        if w.signal_process(signal.SIGUSR1):
            asked[w.rank] = (w, path, start)
        else:
            out[w.rank] = "<exited>"
    last: dict[int, tuple[int, float]] = {}
    begun = time.monotonic()
    deadline = begun + timeout
    fallback = begun + min(FALLBACK, timeout / 3)
    fell_back: set[int] = set()
    while asked:
        now = time.monotonic()
        for rank, (w, path, start) in list(asked.items()):
            size = _size(path)
            prev = last.get(rank)
            if size > start and prev and prev[0] == size and now - prev[1] >= SETTLE:
                with open(path, "rb") as f:
                    f.seek(start)
                    out[rank] = f.read(size - start).decode("utf-8", "replace")
                del asked[rank]
                continue
            if not prev or prev[0] != size:
                last[rank] = (size, now)
            if size == start and now >= fallback and rank not in fell_back:
                # no Python ran SIGUSR1's handler: the main thread is stuck in C
                fell_back.add(rank)
                w.signal_process(signal.SIGUSR2)
        if now >= deadline:
            break
        time.sleep(0.01)  # bounded: at most timeout / 10 ms polls of a few stat() calls
    for rank in asked:
        out[rank] = f"<no answer to SIGUSR1 or SIGUSR2 within {timeout:g} s>"
    return out
