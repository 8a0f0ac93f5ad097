"""Sticky task errors hold whatever the timing: nothing enqueued behind a failed task runs until
the error is raised (docs/runtime.md).

Each case makes many fresh streams (a new worker thread each: the worker may run the failing
task before the host enqueues the follower, or after) and puts a failing task and then a
follower on each; the follower only records that it ran. Before the fix the worker that ran
the failure first let the follower run (34 of 500 fresh streams, more under load). The count
is ``NPUSIM_STICKY_STREAMS`` (default 300 per case); the slow test runs 5,000 per case, also
under load: ``python -m tests.unit.test_sticky_errors 5000`` from the repository root prints
the counts (start two ``python3 -c "while True: pass" &`` beside it for load).
"""
from __future__ import annotations

import logging
import os
import sys
import time

import numpy as np
import pytest

import runtime
from runtime import errors

DEFAULT = int(os.environ.get("NPUSIM_STICKY_STREAMS", "300"))


def _bad():
    raise ValueError("boom")


def _eager(s, ran):
    runtime.launch(_bad, stream=s, name="bad")
    runtime.launch(ran.append, 1, stream=s, name="follower")


def _graph(s, ran):
    """A replay that fails, then a replay behind it."""
    fail, follow = runtime.Graph(), runtime.Graph()
    with runtime.graph(fail, stream=s):
        runtime.launch(_bad, stream=s, name="bad")
    with runtime.graph(follow, stream=s):
        runtime.launch(ran.append, 1, stream=s, name="follower")
    fail.replay(s)
    follow.replay(s)


def _sync_call(s, ran):
    """A failing task, then a host-synchronous memset on the same stream: it must not happen
    (and must raise the task's error)."""
    buf = ran.buf
    runtime.launch(_bad, stream=s, name="bad")
    with runtime.stream(s):
        try:
            runtime.memset(buf, 7, 16)
        except errors.TaskError:
            ran.raised += 1
    if buf.to_host(s)[0] == 7:          # the error was raised: the stream works again
        ran.append(1)
    runtime.memset(buf, 0, 16)


def _event_then_follower(s, ran):
    """A failing task, an event after it, a follower behind the event: the follower is enqueued
    behind the failure, so it is skipped even though an event synchronize raises the error."""
    runtime.launch(_bad, stream=s, name="bad")
    ev = s.record_event()
    runtime.launch(ran.append, 1, stream=s, name="follower")
    try:
        ev.synchronize()
    except errors.TaskError:
        ran.raised += 1


class _Ran(list):
    raised = 0
    buf = None


CASES = {"eager": _eager, "graph replay": _graph, "synchronous call": _sync_call,
         "event then follower": _event_then_follower}


def count_followers(n: int, case: str) -> tuple[int, int]:
    """(followers that ran, errors raised) over ``n`` fresh streams of ``case``."""
    make = CASES[case]
    ran = _Ran()
    ran.buf = runtime.zeros(16, np.uint8)
    for _ in range(n):
        s = runtime.Stream()
        make(s, ran)
        try:
            s.synchronize()
        except errors.TaskError as e:
            assert isinstance(e.__cause__, ValueError) and "boom" in str(e)
            ran.raised += 1
        s.synchronize()                  # raised once: nothing pending any more
        s.destroy()
    ran.buf.free()
    return len(ran), ran.raised


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_follower_of_a_failed_task_runs_on_fresh_streams(device, case):
    ran, raised = count_followers(DEFAULT, case)
    assert (ran, raised) == (0, DEFAULT), f"{ran} of {DEFAULT} followers ran ({case})"


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_follower_runs_in_5000_fresh_streams(device, case):
    ran, raised = count_followers(5000, case)
    assert (ran, raised) == (0, 5000), f"{ran} of 5000 followers ran ({case})"


def test_the_skip_count_names_every_task_enqueued_before_the_error_was_raised(device):
    s = runtime.Stream()
    ran = []
    runtime.launch(_bad, stream=s, name="bad")
    deadline = time.monotonic() + 10     # the failure happens before the followers exist
    while not s.reached(1) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert s.reached(1)
    for i in range(3):
        runtime.launch(ran.append, i, stream=s)
    with pytest.raises(errors.TaskError, match=r"3 task\(s\) enqueued behind it were skipped"):
        s.synchronize()
    assert ran == []
    runtime.launch(ran.append, 9, stream=s)     # raised: new work runs
    s.synchronize()
    assert ran == [9]


if __name__ == "__main__":      # python -m tests.unit.test_sticky_errors [streams per case]
    n = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    logging.getLogger("runtime").setLevel(logging.CRITICAL)    # one failure per stream
    runtime.set_device(0)
    print(f"load {open('/proc/loadavg').read().split()[0]}", flush=True)
    for name in sorted(CASES):
        ran, raised = count_followers(n, name)
        print(f"{name:22s} followers run {ran} / {n} fresh streams; errors raised {raised}",
              flush=True)
    runtime.reset_device()
