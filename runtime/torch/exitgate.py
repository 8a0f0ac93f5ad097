"""The exit gate: npusim's own threads are out of torch's C++ when the interpreter finalizes.

Design note. Many torch calls release the GIL in C++ (an operator, ``Tensor.copy_``,
``Future.set_result``, which then runs the future's callbacks) and take it back in a C++
destructor on the way out. During ``Py_Finalize`` a daemon thread that asks for the GIL is ended
with ``pthread_exit``; its unwinding meets that ``noexcept`` destructor and calls
``std::terminate``: "terminate called without an active exception", SIGABRT, after the script
had finished. npusim has such threads: a stream's worker runs the npu operators queued on it, and
the torch backend's completer copies results into tensors and completes the Works' futures, whose
waiter wakes inside that chain. So the main thread could exit while one of them was still in
torch's C++: 1 torchrun job in about 40 aborted that way with two other programs busy, every
result already written (tests/torch/test_torch_rendezvous.py in CI), and a script ending with npu
operators still queued aborted every time.

Every stretch of those threads that touches torch objects passes the gate (``enter`` /
``leave``), *dropping its references to them included*: a tensor's deallocation releases the GIL
too (``THPVariable_clear``), so a task that ran and then let its tensors go outside the gate
aborted the same way. An atexit handler closes the gate: atexit runs before daemon threads are
stopped, and it waits (at most ``DEADLINE``) for the stretches in progress to end. After that the
gate turns the threads away, and what they would have run or released is kept (``keep``) for
the process's exit: an npu operator still queued is not run, as a real device drops its queue
when its process exits, and a Work's future is not completed, as nobody is left to wait for it.
The threads go on otherwise (a stream's timeline still advances, so nothing waits on them), and
the thread running the atexit handlers passes always. The gate counts only stretches in torch: a
worker waiting on a collective's peers is in Python, where finalization stops it safely, so a
rank's exit never waits for its peers. The handler is registered when this module is first
imported (``import torch_npu``, the torch backend): atexit handlers registered before that run
after it, and a Work they wait for is never completed.
"""
from __future__ import annotations

import atexit
import threading


class ExitGate:
    """The threads inside torch, counted; closed once, at interpreter exit."""

    DEADLINE = 10.0     # seconds the exit waits for the calls in progress (a user's callback)

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0
        self._closer: int | None = None     # the thread that closed it
        self._kept: list = []               # what turned-away threads must not release

    def enter(self) -> bool:
        """May this thread call into torch? If True, call ``leave()`` afterwards."""
        with self._cond:
            if self._closer is not None and self._closer != threading.get_ident():
                return False
            self._inside += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._inside -= 1
            if not self._inside:
                self._cond.notify_all()

    def keep(self, obj) -> None:
        """Hold ``obj`` until the process ends: a thread turned away must not release it."""
        self._kept.append(obj)

    def close(self, deadline: float | None = None) -> bool:
        """Turn every other thread away from now on; wait for those inside to leave. Returns
        whether they all left within ``deadline`` seconds (``DEADLINE`` when None)."""
        with self._cond:
            self._closer = threading.get_ident()
            return self._cond.wait_for(lambda: self._inside == 0,
                                       self.DEADLINE if deadline is None else deadline)


GATE = ExitGate()
atexit.register(GATE.close)


def gated(fn, stream):
    """``fn`` as a task of ``stream`` that calls into torch: run inside the gate, and released
    there after its one run (a task captured into a graph runs at every replay: the graph keeps
    it, and whoever releases the graph releases it)."""
    box = [fn]
    once = stream.capture is None
    del fn

    def task():
        if not GATE.enter():
            GATE.keep(box)      # the interpreter exits: neither run nor released here
            return
        try:
            (box.pop() if once else box[0])()   # the last reference goes inside the gate
        finally:
            GATE.leave()
    return task
