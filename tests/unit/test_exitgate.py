"""runtime/torch/exitgate.py: once closed, other threads are turned away and the closer waits
for those inside (bounded); a gated task runs once and drops its function inside the gate."""
from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from runtime.torch.exitgate import ExitGate


@pytest.mark.timeout(30)
def test_close_waits_for_the_thread_inside_then_turns_threads_away():
    gate = ExitGate()
    inside, release, left = threading.Event(), threading.Event(), threading.Event()

    def worker():
        assert gate.enter()
        inside.set()
        release.wait(10)
        gate.leave()
        left.set()
    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    threading.Timer(0.1, release.set).start()
    assert gate.close(deadline=10) is True
    assert left.is_set()                       # close returned only after the worker left
    turned = []
    t2 = threading.Thread(target=lambda: turned.append(gate.enter()))
    t2.start()
    t2.join(10)
    t.join(10)
    assert turned == [False]
    assert gate.enter() is True                # the closing thread passes (atexit handlers)
    gate.leave()


@pytest.mark.timeout(30)
def test_close_gives_up_at_its_deadline():
    gate = ExitGate()
    entered = threading.Event()
    stop = threading.Event()

    def stuck():
        gate.enter()
        entered.set()
        stop.wait(10)
        gate.leave()
    t = threading.Thread(target=stuck)
    t.start()
    assert entered.wait(10)
    t0 = time.monotonic()
    assert gate.close(deadline=0.2) is False
    assert 0.15 < time.monotonic() - t0 < 5
    stop.set()
    t.join(10)


class _Stream:
    capture = None


@pytest.mark.timeout(30)
def test_a_gated_task_runs_once_and_releases_its_function_inside(monkeypatch):
    from runtime.torch import exitgate
    gate = ExitGate()
    monkeypatch.setattr(exitgate, "GATE", gate)
    seen = []

    class Fn:
        def __call__(self):
            seen.append(gate._inside)
    fn = Fn()
    ref = weakref.ref(fn)
    task = exitgate.gated(fn, _Stream())
    del fn
    task()
    gc.collect()
    assert seen == [1] and ref() is None       # ran inside, and is gone with the run
    gate.close(deadline=1)
    fn2 = Fn()
    ref2 = weakref.ref(fn2)
    task2 = exitgate.gated(fn2, _Stream())
    del fn2
    t = threading.Thread(target=task2)         # a worker after the exit began
    t.start()
    t.join(10)
    gc.collect()
    assert seen == [1] and ref2() is not None  # neither run nor released by that thread
