"""The hccl torch backend's Completer (hccl/torch/work.py): a Work whose end event is reached
at its submit completes at once, in the submitting thread; one submitted behind a Work still
queued waits its turn, so Works complete in call order; an error sticks to the later Works."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

from hccl.torch.work import Completer  # noqa: E402


class _Event:
    """An end event the test reaches by hand (``reach``), or that fails at its wait."""

    def __init__(self, reached=True, error=None):
        self._reached = threading.Event()
        if reached:
            self._reached.set()
        self.error = error

    def reach(self):
        self._reached.set()

    def query(self):
        return self._reached.is_set()

    def synchronize(self):
        assert self._reached.wait(10), "the test never reached this event"
        if self.error is not None:
            raise self.error


class _Work:
    def __init__(self, name, log):
        self.name, self.log, self.error = name, log, "pending"
        self.thread = None
        self.done = threading.Event()

    def complete(self, error):
        self.error, self.thread = error, threading.current_thread()
        self.log.append(self.name)
        self.done.set()


@pytest.fixture
def c():
    completer = Completer("t")
    yield completer
    completer.close()


@pytest.mark.timeout(30)
def test_a_reached_work_completes_at_its_submit_in_the_caller(c):
    log, cleaned = [], []
    w = _Work("a", log)
    c.submit(w, _Event(), lambda: log.append("finish a"), lambda: cleaned.append("a"))
    assert log == ["finish a", "a"] and cleaned == ["a"]
    assert w.error is None and w.thread is threading.current_thread()


@pytest.mark.timeout(30)
def test_a_reached_work_behind_a_queued_one_completes_after_it_on_the_thread(c):
    log = []
    first, second = _Work("first", log), _Work("second", log)
    gate = _Event(reached=False)
    c.submit(first, gate, lambda: None, lambda: None)          # queued: not reached
    c.submit(second, _Event(), lambda: None, lambda: None)      # reached, but behind it
    assert log == [] and not second.done.is_set()
    gate.reach()
    assert second.done.wait(10)
    assert log == ["first", "second"]
    assert first.thread is second.thread is not threading.current_thread()
    third = _Work("third", log)                                 # the queue emptied
    c.submit(third, _Event(), lambda: None, lambda: None)
    assert log[-1] == "third" and third.thread is threading.current_thread()


@pytest.mark.timeout(30)
def test_a_failure_at_the_submit_sticks_to_the_later_works(c):
    log = []
    boom = RuntimeError("stream failed")
    a, b = _Work("a", log), _Work("b", log)
    c.submit(a, _Event(error=boom), lambda: log.append("finish a"), lambda: None)
    c.submit(b, _Event(), lambda: log.append("finish b"), lambda: None)
    assert a.error is boom and b.error is boom        # b's results are not reported
    assert log == ["a", "b"]                          # and nothing was copied back


_EXIT_SCRIPT = r"""
import threading, time
from hccl.torch.work import Completer, Work

class Reached:                       # an end event the completer thread reaches at once
    def query(self): return False    # not at submit: the Work goes to the thread
    def synchronize(self): pass

inside = threading.Event()
def callback(fut):                   # runs in the completer thread, inside set_result
    inside.set()
    time.sleep(0.05)
    print("callback done", flush=True)

work = Work("all_reduce", [])
work.get_future().then(callback)
Completer("exit").submit(work, Reached(), lambda: None, lambda: None)
assert inside.wait(10)
print("main exits", flush=True)      # while the completer thread is in torch's C++
"""


@pytest.mark.timeout(60)
def test_the_interpreter_exits_cleanly_while_a_completion_is_in_torch():
    """A daemon thread asking for the GIL during finalization is pthread_exit-ed; inside torch's
    future completion that is std::terminate and SIGABRT (hccl/torch/work.py, the module note):
    the exit waits for the completion to leave torch instead."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], capture_output=True, text=True,
                         timeout=50, env={**os.environ, "PYTHONPATH": root})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["main", "exits", "callback", "done"]
    assert "terminate" not in res.stderr
