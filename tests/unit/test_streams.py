"""Streams and events: ordering, concurrency, sticky errors, timeouts."""
import os
import threading
import time

import numpy as np
import pytest

import runtime
from runtime import errors

pytestmark = pytest.mark.timeout(30)


def test_tasks_run_in_order_and_enqueue_returns_at_once(device):
    s = runtime.Stream()
    out = []
    gate = threading.Event()
    runtime.launch(lambda: gate.wait(5), stream=s)
    for i in range(100):
        runtime.launch(out.append, i, stream=s)
    assert out == [] and not s.query()     # returned before the work ran
    gate.set()
    s.synchronize()
    assert out == list(range(100)) and s.query()


def test_two_streams_run_concurrently(device):
    a, b = runtime.Stream(), runtime.Stream()
    ran_a, ran_b = threading.Event(), threading.Event()

    def meet(mine, other):
        # each kernel waits for the other to be running: only concurrent streams get past this
        mine.set()
        if not other.wait(30):
            raise AssertionError("the other stream's kernel never ran while this one was running")
    runtime.launch(meet, ran_a, ran_b, stream=a)
    runtime.launch(meet, ran_b, ran_a, stream=b)
    a.synchronize()
    b.synchronize()
    assert ran_a.is_set() and ran_b.is_set()


def test_event_orders_work_across_streams(device):
    a, b = runtime.Stream(), runtime.Stream()
    x = runtime.zeros(4, np.float32)
    y = runtime.zeros(4, np.float32)

    def slow_fill(v):
        time.sleep(0.2)
        v[:] = 7

    runtime.launch(slow_fill, x, stream=a)
    ev = a.record_event()
    b.wait_event(ev)
    runtime.launch(lambda src, dst: np.copyto(dst, src * 2), x, y, stream=b)
    b.synchronize()
    assert ev.query()
    np.testing.assert_array_equal(y.to_host(), np.full(4, 14, np.float32))


def test_wait_stream(device):
    a, b = runtime.Stream(), runtime.Stream()
    seen = []
    runtime.launch(lambda: (time.sleep(0.1), seen.append("a")), stream=a)
    b.wait_stream(a)
    runtime.launch(lambda: seen.append("b"), stream=b)
    b.synchronize()
    assert seen == ["a", "b"]


def test_never_recorded_event_is_complete(device):
    ev = runtime.Event()
    assert ev.query()
    ev.synchronize(timeout=0.01)
    s = runtime.Stream()
    s.wait_event(ev)
    s.synchronize(timeout=1)


def test_a_wait_on_a_reached_event_enqueues_nothing(device):
    """As on an NPU, waiting for work that has finished costs the waiter nothing: no task, so
    an idle stream stays idle (and its next collective may run at its issue)."""
    a, b = runtime.Stream(), runtime.Stream()
    runtime.launch(lambda: None, stream=a)
    ev = a.record_event()
    ev.synchronize()
    before = b.issued
    b.wait_event(ev)
    assert b.issued == before and b.query()
    gate = threading.Event()            # not reached yet: the wait is a task again
    runtime.launch(gate.wait, 5, stream=a)
    b.wait_event(a.record_event())
    assert b.issued == before + 1
    gate.set()
    b.synchronize()


def test_a_wait_on_a_reached_event_of_a_failed_stream_still_fails(device):
    """Reached, but with a failure no synchronize has raised: the waiter's later work depends
    on it, so the wait stays a task and fails it (the failure is passed on, not skipped)."""
    comm, compute = runtime.Stream(), runtime.Stream()
    runtime.launch(lambda: 1 / 0, stream=comm, name="reduce")
    ev = comm.record_event()
    _wait_for(comm.query, "the failing task to finish")
    ran = []
    compute.wait_event(ev)
    runtime.launch(ran.append, 1, stream=compute)
    with pytest.raises(errors.TaskError, match="wait_event") as ei:
        compute.synchronize()
    assert isinstance(ei.value.__cause__, ZeroDivisionError) and ran == []
    with pytest.raises(errors.TaskError, match="reduce"):
        comm.synchronize()


def test_task_error_is_sticky_skips_and_raises_once(device):
    s = runtime.Stream()
    ran = []

    def bad():
        raise ValueError("boom 42")

    gate = threading.Event()
    runtime.launch(gate.wait, 5, stream=s)
    runtime.launch(bad, stream=s, name="my_kernel")
    runtime.launch(ran.append, 1, stream=s)           # enqueued behind the failure: skipped
    gate.set()
    with pytest.raises(errors.TaskError) as ei:
        s.synchronize()
    err = ei.value
    assert err.task == "my_kernel" and "test_streams.py" in err.site
    assert isinstance(err.__cause__, ValueError) and "boom 42" in str(err)
    assert ran == []
    s.synchronize()                                     # raised once only
    runtime.launch(ran.append, 2, stream=s)             # the stream runs new work again
    s.synchronize()
    assert ran == [2]


def test_error_surfaces_through_event_and_device(device):
    s = runtime.Stream()
    runtime.launch(lambda: 1 / 0, stream=s, name="div")
    ev = s.record_event()
    with pytest.raises(errors.TaskError, match="div"):
        ev.synchronize()
    runtime.launch(lambda: 1 / 0, stream=s, name="div2")
    with pytest.raises(errors.TaskError, match="div2"):
        runtime.synchronize()


def test_a_stream_waiting_on_a_failed_streams_event_fails_too(device):
    """The waiter's work depends on the failed task: it is skipped, and both streams raise the
    failure (with its own type) until it was raised once on the failed stream."""
    comm, compute = runtime.Stream(), runtime.Stream()
    ran = []

    def bad():
        raise ValueError("boom 7")

    gate = threading.Event()     # the failure comes after the dependent work is enqueued
    runtime.launch(gate.wait, 10, stream=comm)
    runtime.launch(bad, stream=comm, name="reduce")
    ev = comm.record_event()
    compute.wait_event(ev)
    runtime.launch(ran.append, "used the result", stream=compute)
    gate.set()
    with pytest.raises(errors.TaskError) as ei:
        compute.synchronize()
    assert isinstance(ei.value.__cause__, ValueError) and "boom 7" in str(ei.value)
    assert "wait_event" in str(ei.value) and ran == []
    with pytest.raises(errors.TaskError, match="reduce"):
        comm.synchronize()                              # still pending on the failed stream
    compute.wait_event(comm.record_event())             # raised there: later waits go on
    runtime.launch(ran.append, "fresh", stream=compute)
    compute.synchronize()
    assert ran == ["fresh"]
    other = runtime.Stream()                            # wait_stream behaves alike
    gate.clear()
    runtime.launch(gate.wait, 10, stream=comm)
    runtime.launch(bad, stream=comm, name="reduce2")
    other.wait_stream(comm)
    runtime.launch(ran.append, "no", stream=other)
    gate.set()
    with pytest.raises(errors.TaskError, match="boom 7"):
        other.synchronize()
    with pytest.raises(errors.TaskError, match="reduce2"):
        comm.synchronize()
    assert ran == ["fresh"]


def test_synchronize_timeout_changes_nothing(device):
    s = runtime.Stream()
    gate = threading.Event()
    out = []
    runtime.launch(lambda: gate.wait(10), stream=s, name="blocker")
    runtime.launch(out.append, "done", stream=s)
    with pytest.raises(errors.SyncTimeoutError) as ei:
        s.synchronize(timeout=0.05)
    assert ei.value.code == 507046 and "blocker" in str(ei.value)
    ev = s.record_event()
    with pytest.raises(errors.SyncTimeoutError):
        ev.synchronize(timeout=0.01)
    gate.set()
    s.synchronize(timeout=5)
    assert out == ["done"]


def test_elapsed_time(device):
    s = runtime.Stream()
    a, b = runtime.Event(enable_timing=True), runtime.Event(enable_timing=True)
    a.record(s)
    runtime.launch(time.sleep, 0.05, stream=s)
    b.record(s)
    b.synchronize()
    ms = a.elapsed_time(b)
    assert 45 <= ms < 5000, ms          # at least the sleep; the upper bound is load slack
    with pytest.raises(errors.InvalidParamError, match="enable_timing"):
        runtime.Event().elapsed_time(b)


def test_current_stream_context_manager(device):
    s = runtime.Stream()
    assert runtime.current_stream() is runtime.default_stream()
    with runtime.stream(s):
        assert runtime.current_stream() is s
        with runtime.stream(runtime.default_stream()):
            assert runtime.current_stream() is runtime.default_stream()
        assert runtime.current_stream() is s
    assert runtime.current_stream() is runtime.default_stream()


def test_callback_in_order(device):
    s = runtime.Stream()
    seen = []
    runtime.launch(lambda: seen.append("k"), stream=s)
    runtime.launch_callback(lambda: seen.append("cb"), stream=s)
    s.synchronize()
    assert seen == ["k", "cb"]


def test_launch_non_callable(device):
    with pytest.raises(errors.InvalidParamError, match="callable"):
        runtime.launch(42)
    with pytest.raises(errors.InvalidParamError, match="callable"):
        runtime.launch_callback("nope")
    runtime.synchronize()


def test_destroyed_stream_rejects_work(device):
    s = runtime.Stream()
    s.destroy()
    with pytest.raises(errors.InvalidParamError, match="destroyed"):
        runtime.launch(print, stream=s)
    with pytest.raises(errors.InvalidParamError):
        runtime.default_stream().destroy()


def test_use_before_set_device_says_what_to_call():
    def other_thread(box):
        try:
            import runtime.current as c
            c.thread.device = None
            saved, c.process_device = c.process_device, None
            try:
                runtime.Stream()
            finally:
                c.process_device = saved
        except errors.ContextError as e:
            box.append(e)
    box = []
    t = threading.Thread(target=other_thread, args=(box,))
    t.start()
    t.join()
    assert box and "set_device" in str(box[0]) and "LOCAL_RANK" in str(box[0])


def test_set_device_out_of_range():
    with pytest.raises(errors.InvalidParamError, match="NPUSIM_DEVICE_COUNT"):
        runtime.set_device(99)



def test_work_left_behind_by_a_partial_synchronize_runs_without_anyone_waiting(device):
    """A caller that runs the queue itself up to its value takes back the worker's wake-up;
    what it leaves behind must ring the worker again (nobody synchronizes the rest)."""
    s = runtime.Stream()
    runtime.launch(lambda: None, stream=s)
    s.synchronize()                       # the worker exists and sleeps
    for i in range(200):
        ran, order = threading.Event(), []
        runtime.launch(order.append, 1, stream=s)
        runtime.launch(lambda: (order.append(2), ran.set()), stream=s)
        s.wait_value(s.issued - 1)        # runs at most the first task in this thread
        assert ran.wait(10), f"round {i}: the task left in the queue never ran"
        assert order == [1, 2]
    s.synchronize()
    assert s.query()


def test_an_enqueue_wakes_a_sleeping_worker_every_time(device):
    """No synchronize at all: each task is run by the worker, woken by its enqueue."""
    s = runtime.Stream()
    for i in range(300):
        ran = threading.Event()
        runtime.launch(ran.set, stream=s)
        assert ran.wait(10), f"task {i} never ran"
    assert s.query()


def _wait_for(cond, what, seconds=10.0):
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.001)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling classes")
@pytest.mark.parametrize("knob", ["1", None])
def test_a_worker_woken_for_taken_work_stops_preempting_and_runs_work_at_once_again(
        device, monkeypatch, knob):
    """The worker's class follows what its wake-ups find: work a synchronizing caller already
    runs -> SCHED_BATCH; work nobody else runs -> the default class (only with
    NPUSIM_SCHED_BATCH=1; unset, the default: always the default class, runtime/sched.py)."""
    if knob is None:
        monkeypatch.delenv("NPUSIM_SCHED_BATCH", raising=False)
    else:
        monkeypatch.setenv("NPUSIM_SCHED_BATCH", knob)
    s = runtime.Stream()
    ran, tid = threading.Event(), []
    runtime.launch(lambda: (tid.append(threading.get_native_id()), ran.set()), stream=s)
    assert ran.wait(10) and tid[0] != threading.get_native_id()   # the worker ran it
    worker = tid[0]
    assert os.sched_getscheduler(worker) == os.SCHED_OTHER

    for _ in range(200):    # until the helper, not the woken worker, runs the gated task
        gate, inside, runner = threading.Event(), threading.Event(), []
        runtime.launch(lambda: (runner.append(threading.get_native_id()), inside.set(),
                                gate.wait(10)), stream=s)
        helper = threading.Thread(target=s.synchronize)
        helper.start()
        assert inside.wait(10)
        if runner[0] == helper.native_id:
            break
        gate.set()
        helper.join(10)
    else:
        pytest.skip("the worker always ran the task before a synchronizing thread could")
    last = threading.Event()
    runtime.launch(last.set, stream=s)                   # rings the worker; the queue is taken
    if knob == "1":
        _wait_for(lambda: os.sched_getscheduler(worker) == os.SCHED_BATCH,
                  "a worker woken for taken work stayed in the default class")
    gate.set()
    helper.join(10)
    assert last.wait(10)                                 # left behind: the worker ran it
    assert os.sched_getscheduler(worker) == os.SCHED_OTHER
    s.synchronize()
