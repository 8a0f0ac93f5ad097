"""A replay is enqueued lazily (``Stream.enqueue_lazy``): the host's synchronize runs it, and
work nobody waits for still runs, within the worker's patrol."""
import threading
import time

import numpy as np
import pytest

import runtime
from runtime.errors import TaskError
from runtime import stream as stream_mod

pytestmark = pytest.mark.timeout(120)


def test_a_replay_nobody_waits_for_runs_on_its_own(device):
    s = runtime.Stream()
    x = runtime.to_device(np.zeros(4, np.int64))
    seen = []
    done = threading.Event()

    def bump(a):
        a += 1
        seen.append(int(a[0]))
        if len(seen) % 5 == 0:
            done.set()

    g = runtime.Graph()
    with runtime.graph(g, stream=s):
        runtime.launch(bump, x, stream=s)
    for k in range(1, 4):               # the first rings and starts the patrol; the others not
        for _ in range(5):
            g.replay(s)
        t0 = time.perf_counter()
        # no synchronize, no other call on the stream: the worker finds the replays itself
        assert done.wait(5.0), f"round {k}: the lazily enqueued replays never ran"
        assert time.perf_counter() - t0 < 2.0
        done.clear()
        assert seen[-1] == 5 * k
    assert s._patrol
    s.synchronize()
    assert np.array_equal(x.to_host(), np.full(4, 15))
    s.destroy()


def test_the_patrol_ends_when_nothing_comes(device, monkeypatch):
    monkeypatch.setattr(stream_mod, "PATROL_IDLE", 5)
    s = runtime.Stream()
    x = runtime.to_device(np.zeros(4, np.int64))
    g = runtime.Graph()
    with runtime.graph(g, stream=s):
        runtime.launch(lambda a: a.__iadd__(1), x, stream=s)
    g.replay(s)
    s.synchronize()
    deadline = time.monotonic() + 5.0
    while s._patrol and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not s._patrol                # idle again: it sleeps without a timeout
    ev = threading.Event()
    with runtime.graph(g2 := runtime.Graph(), stream=s):
        runtime.launch_callback(ev.set, stream=s)
    g2.replay(s)                        # a lazy enqueue to a worker not patrolling rings it
    assert ev.wait(5.0)
    assert np.array_equal(x.to_host(), np.full(4, 1))
    s.destroy()


def test_a_failing_lazy_replay_is_the_streams_error_once(device):
    s = runtime.Stream()

    def boom():
        raise ValueError("boom")

    g = runtime.Graph()
    with runtime.graph(g, stream=s):
        runtime.launch(boom, stream=s)
    g.replay(s)
    with pytest.raises(TaskError, match="boom"):
        s.synchronize()
    s.synchronize()                     # raised once
    s.destroy()
