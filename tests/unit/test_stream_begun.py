"""Stream.enqueue_begun: a task's first part runs at the call on an idle stream only, in order."""
import threading

import numpy as np
import pytest

import runtime
from runtime.errors import TaskError

pytestmark = pytest.mark.timeout(60)


def test_an_idle_stream_begins_the_task_in_the_calling_thread_and_keeps_the_order(device):
    s = runtime.Stream()
    log = []

    def begin():
        log.append(("begin", threading.get_ident()))
        return lambda: log.append(("task", s.completed))

    v = s.enqueue_begun(begin, "t")
    assert v == s.issued and log == [("begin", threading.get_ident())]  # before it returned
    runtime.launch(lambda: log.append(("next", s.completed)), stream=s)
    s.synchronize()
    assert [e[0] for e in log] == ["begin", "task", "next"]
    assert log[1][1] == v - 1 and log[2][1] == v       # each ran after everything before it
    s.destroy()


def test_a_busy_stream_calls_nothing_and_says_so(device):
    s = runtime.Stream()
    gate = threading.Event()
    runtime.launch(gate.wait, stream=s)                 # queued or running: not idle
    called = []
    assert s.enqueue_begun(lambda: called.append(1) or (lambda: None), "t") is None
    gate.set()
    s.synchronize()
    assert called == []

    def boom():
        raise ValueError("no")
    runtime.launch(boom, stream=s)
    while s.completed < s.issued:                       # the error is pending, not raised yet
        threading.Event().wait(0.001)
    assert s.enqueue_begun(lambda: called.append(1) or (lambda: None), "t") is None
    with pytest.raises(TaskError, match="no"):
        s.synchronize()
    assert s.enqueue_begun(lambda: called.append(1) or (lambda: None), "t") is not None
    s.synchronize()
    assert called == [1]
    s.destroy()


def test_a_capturing_stream_is_never_begun(device):
    s = runtime.Stream()
    x = runtime.to_device(np.ones(4, np.float32))
    g = runtime.Graph("g")
    with runtime.graph(g, stream=s):
        assert s.enqueue_begun(lambda: (lambda: None), "t") is None
        runtime.launch(lambda: None, stream=s)
    g.replay(s)
    s.synchronize()
    del x
    s.destroy()
