"""Fixtures shared by the ZeroMQ-based unit tests (store, transport): log capture for the hccl
loggers, and checks that no thread or file descriptor of ours survives a test."""
import logging
import os
import threading

import pytest
import zmq


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def warnings_of():
    """Collect WARNING records of a logger (the hccl loggers do not propagate to caplog)."""
    undo = []

    def attach(name):
        logger, h = logging.getLogger(name), _Records()
        undo.append((logger, h, logger.level))
        logger.addHandler(h)
        logger.setLevel(logging.WARNING)
        return h.records
    yield attach
    for logger, h, level in undo:
        logger.removeHandler(h)
        logger.setLevel(level)


def _our_threads():
    return {t for t in threading.enumerate() if t.name.startswith("hccl-")}


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module", autouse=True)
def pyzmq_gc_started():
    """pyzmq starts a process-wide helper (a thread, a context) at the first zero-copy send and
    keeps it: start it before any test measures what it leaves behind."""
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://warm-up")
    b.connect("inproc://warm-up")
    tracker = a.send(b"x" * (2 * zmq.COPY_THRESHOLD), copy=False, track=True)
    b.recv()
    tracker.wait(5)
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()


@pytest.fixture(autouse=True)
def no_leftovers():
    """No thread of ours and no file descriptor (socket, zmq context) survives a test."""
    before_threads, before_fds = _our_threads(), _open_fds()
    yield
    assert _our_threads() - before_threads == set()
    assert _open_fds() <= before_fds


@pytest.fixture
def stranger():
    """A stranger's DEALER sockets: ``stranger(address, identity=None)`` connects one."""
    ctx = zmq.Context()
    socks = []

    def make(address, identity=None):
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        if identity is not None:
            s.routing_id = identity
        s.connect(address)
        socks.append(s)
        return s
    yield make
    for s in socks:
        s.close()
    ctx.term()
