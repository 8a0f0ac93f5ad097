"""The stream sanitizer checks the nodes of a task graph at every replay, like eager tasks (both
sites named), names no race in properly ordered code, and stream-ordered frees make none."""
from __future__ import annotations

import inspect
import os
import threading

import numpy as np
import pytest

import runtime
from runtime.errors import MemoryAccessError, StreamRaceError

pytestmark = pytest.mark.timeout(60)
HERE = os.path.abspath(__file__)


@pytest.fixture
def check(device):
    runtime.enable_stream_check("raise")
    yield
    runtime.enable_stream_check("off")


def _line() -> str:
    """``file:line`` of the caller: the site a report must name."""
    f = inspect.currentframe().f_back
    return f"{HERE}:{f.f_lineno}"


def _noop(*_):
    pass


def _capture_write(s, x):
    """A graph whose one node writes ``x``; returns it and its capture line."""
    g = runtime.Graph()
    with runtime.graph(g, stream=s):
        runtime.launch(_noop, x, stream=s, name="node_write"); line = _line()
    return g, line


def test_a_replay_racing_an_eager_task_is_named_with_both_sites(check):
    s, t = runtime.Stream(name="graphs"), runtime.Stream(name="eager")
    x = runtime.zeros(64)
    runtime.synchronize()
    g, node_line = _capture_write(s, x)
    g.replay(s); replay_line = _line()
    with pytest.raises(StreamRaceError) as e:
        eager_line = _line(); runtime.launch(_noop, x, stream=t, name="eager_write")
    msg = str(e.value)
    assert "'node_write' on graphs" in msg and "'eager_write' on eager" in msg
    assert node_line in msg and replay_line in msg and eager_line in msg
    assert e.value.first_task == "node_write" and e.value.second_task == "eager_write"
    runtime.synchronize()


def test_a_replay_after_an_unordered_eager_task_raises_at_the_replay(check):
    s, t = runtime.Stream(name="graphs"), runtime.Stream(name="eager")
    x = runtime.zeros(64)
    runtime.synchronize()
    g, node_line = _capture_write(s, x)
    runtime.launch(_noop, runtime.read_only(x), stream=t, name="eager_read"); eager_line = _line()
    issued = s.issued
    with pytest.raises(StreamRaceError) as e:
        replay_line = _line(); g.replay(s)
    assert s.issued == issued                           # nothing was queued
    msg = str(e.value)
    assert "'eager_read' on eager" in msg and "'node_write' on graphs" in msg
    assert eager_line in msg and node_line in msg and replay_line in msg
    runtime.synchronize()


def test_properly_ordered_replays_name_no_race(check):
    s, t = runtime.Stream(), runtime.Stream()
    x, y = runtime.zeros(64), runtime.zeros(64)
    runtime.synchronize()
    g = runtime.Graph()
    ev = runtime.Event()
    with runtime.graph(g, stream=s):
        runtime.launch(_noop, x, runtime.read_only(y), stream=s)    # nodes of one replay
        runtime.launch(_noop, y, runtime.read_only(x), stream=s)    # never race each other
        ev.record(s)
    for _ in range(3):
        g.replay(s)
        t.wait_event(ev)                     # the event recorded inside points at the replay
        runtime.launch(_noop, x, stream=t)
        s.wait_stream(t)
    g.replay(s)
    s.synchronize()
    runtime.launch(_noop, y, stream=t)       # after the host waited for the replay
    runtime.synchronize()


def test_stream_ordered_frees_make_no_false_race_and_keep_real_ones(check):
    s, t = runtime.Stream(name="own"), runtime.Stream(name="other")
    with runtime.stream(s):
        x = runtime.zeros(64)
        y = runtime.zeros(64)
    g, _ = _capture_write(s, x)
    gate = threading.Event()
    runtime.launch(gate.wait, 10, stream=s)
    g.replay(s)
    runtime.launch(_noop, y, stream=s)
    x.free()                                  # behind its own stream's work: no race
    y.free()
    gate.set()
    s.synchronize()
    with runtime.stream(s):
        z = runtime.zeros(64)
    runtime.launch(_noop, z, stream=t, name="other_write"); first = _line()
    with pytest.raises(StreamRaceError) as e:  # t's work may still use it: a real race
        second = _line(); z.free()
    assert first in str(e.value) and second in str(e.value) and "free" in str(e.value)
    t.synchronize()
    z.free()


def test_a_buffer_freed_since_the_capture_is_a_use_after_free_at_the_replay(check):
    s = runtime.Stream()
    with runtime.stream(s):
        x = runtime.zeros(64)
    g, _ = _capture_write(s, x)
    g.replay(s)
    s.synchronize()
    x.free()
    with pytest.raises(MemoryAccessError, match="use after free"):
        g.replay(s)
    runtime.synchronize()


def test_graph_nodes_are_noted_only_while_the_check_is_on(device):
    s = runtime.Stream()
    x = runtime.zeros(64)
    g, _ = _capture_write(s, x)
    assert g._accesses == []
    g.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(x.to_host(), np.zeros(64, np.float32))
