"""A small eager call runs in the caller as far as its messages come (``Program.begin`` with a
deadline, ``Stream.enqueue_begun`` completing a task without its worker), and hands the rest to
the stream's worker, never holding the caller past the deadline."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import runtime
from hccl import executor
from hccl.steps import Copy, Recv, Send
from hccl.transport.base import DONE, Pair, SendHandle

pytestmark = pytest.mark.timeout(60)
FP = (1, 2, 3, 4, 5)


class _Held(SendHandle):
    """A zero-copy send still being delivered until ``release``."""

    def __init__(self):
        self.ok = False

    def done(self) -> bool:
        return self.ok

    def wait(self, timeout=None) -> None:
        self.ok = True


class _Box(Pair):
    """One rank talking to itself: a send files its bytes under its step (its handle held back
    when ``hold``), a receive takes them; ``spins`` logs what each try_recv was allowed."""

    def __init__(self, hold=()):
        self.box, self.hold, self.spins, self.handles = {}, set(hold), [], []

    def send(self, comm_id, seq, step, fp, mv):
        self.box[step] = bytes(mv)
        if step in self.hold:
            h = _Held()
            self.handles.append(h)
            return h
        return DONE

    def try_recv(self, comm_id, seq, step, fp, consume, spin=0.0):
        self.spins.append(spin)
        if step not in self.box:
            time.sleep(max(0.0, spin))          # "spins" for its budget, and nothing comes
            return False
        consume(memoryview(self.box.pop(step)))
        return True

    def recv_into(self, comm_id, seq, step, fp, timeout, consume):
        consume(memoryview(self.box.pop(step)))


def _program(steps, pair, nbytes=8):
    views = executor.prepare_buffers(steps, {"send": np.arange(nbytes, dtype=np.uint8),
                                             "recv": np.zeros(nbytes, np.uint8)})
    return executor.bind(steps, views, None, "uint8", [pair]), views


def test_a_program_whose_messages_are_there_runs_whole_in_the_caller():
    pair = _Box()
    prog, views = _program([Send(0, "send", 0, 8, 0), Recv(0, "recv", 0, 8, 0),
                            Copy("send", 0, "recv", 0, 4)], pair)
    assert prog.begin(1, 1, FP, 10.0, None, time.perf_counter() + 1.0) is None
    assert views["recv"].tolist() == list(range(8))
    assert len(pair.spins) == 1 and 0 < pair.spins[0] <= 1.0


def test_a_message_not_there_hands_the_rest_over_within_the_deadline():
    pair = _Box()
    prog, views = _program([Send(0, "send", 0, 8, 0), Recv(0, "recv", 0, 8, 5),
                            Recv(0, "recv", 0, 8, 0)], pair)
    t0 = time.perf_counter()
    ahead = prog.begin(1, 1, FP, 10.0, None, t0 + 0.02)
    took = time.perf_counter() - t0
    assert ahead is not None and ahead[0] == 1          # stopped at the missing receive
    assert took < 0.5                                   # the deadline, not a wait for the peer
    pair.box[5] = bytes(range(10, 18))                  # the peer's message comes later
    prog.run(1, 1, FP, 10.0, None, *ahead)
    assert views["recv"].tolist() == list(range(8))     # step 0's payload came last


def test_without_a_deadline_it_stops_at_the_first_receive():
    pair = _Box()
    prog, _ = _program([Send(0, "send", 0, 8, 0), Recv(0, "recv", 0, 8, 0)], pair)
    ahead = prog.begin(1, 1, FP, 10.0)
    assert ahead is not None and ahead[0] == 1 and pair.spins == []
    prog.run(1, 1, FP, 10.0, None, *ahead)


def test_a_send_still_delivered_stops_the_step_that_overwrites_its_bytes():
    pair = _Box(hold={0})
    prog, views = _program([Send(0, "recv", 0, 4, 0), Send(0, "send", 0, 8, 1),
                            Copy("send", 4, "recv", 4, 4),     # disjoint: runs
                            Copy("send", 0, "recv", 0, 4),     # overwrites the held send: stops
                            Recv(0, "scratch", 0, 4, 0), Recv(0, "scratch", 0, 8, 1)], pair)
    ahead = prog.begin(1, 1, FP, 10.0, None, time.perf_counter() + 1.0)
    assert ahead is not None and ahead[0] == 3 and len(ahead[1].items) == 1
    assert views["recv"].tolist() == [0, 0, 0, 0, 4, 5, 6, 7]
    prog.run(1, 1, FP, 10.0, None, *ahead)              # waits the send, then goes on
    assert pair.handles[0].ok and views["recv"].tolist() == list(range(8))


def test_a_send_still_delivered_at_the_end_is_left_to_the_task():
    pair = _Box(hold={0})
    prog, _ = _program([Send(0, "send", 0, 8, 0)], pair)
    ahead = prog.begin(1, 1, FP, 10.0, None, time.perf_counter() + 1.0)
    assert ahead is not None and ahead[0] == 1 and not pair.handles[0].ok
    prog.run(1, 1, FP, 10.0, None, *ahead)
    assert pair.handles[0].ok
    pair2 = _Box()
    assert _program([Send(0, "send", 0, 8, 0)], pair2)[0].begin(
        1, 1, FP, 10.0, None, time.perf_counter() + 1.0) is None


def test_a_task_done_by_its_begin_completes_without_the_worker(device):
    s = runtime.Stream()
    log = []
    v = s.enqueue_begun(lambda: log.append(s.completed), "t")   # returns None: done here
    assert log == [0] and v == 1 and s.issued == s.completed == 1 and s.query()
    assert s._thread is None                            # no worker was ever started
    ev = s.record_event()
    assert ev.query()
    s.synchronize()
    runtime.launch(lambda: log.append(s.completed), stream=s)
    s.synchronize()
    assert log == [0, 1]
    s.destroy()


def test_work_enqueued_by_another_thread_meanwhile_stays_ahead_of_a_done_begin(device):
    s = runtime.Stream()
    gate, entered = threading.Event(), threading.Event()
    log = []

    def begin():
        entered.set()
        gate.wait(10)                       # another thread enqueues while this one begins
        log.append("begun")

    def other():
        entered.wait(10)
        runtime.launch(lambda: log.append(("other", s.completed)), stream=s)
        gate.set()

    t = threading.Thread(target=other)
    t.start()
    v = s.enqueue_begun(begin, "t")
    t.join(10)
    assert v == 2                           # behind the other thread's task, value 1
    s.synchronize()
    assert log == ["begun", ("other", 0)] and s.completed == 2
    s.destroy()
