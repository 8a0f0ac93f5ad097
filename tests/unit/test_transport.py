"""Transport semantics, one body run over InprocFabric and over ProcessTransport, sockets only
and through shared-memory rings (ranks as threads)."""
import logging
import os
import pickle
import secrets
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import zmq

from hccl import wire
from hccl.transport import (Aborted, FingerprintMismatch, InprocFabric, PeerTimeout,
                            TransportClosed, ProcessTransport)
from hccl.transport import shm
from hccl.transport.base import DONE, as_bytes_view

pytestmark = pytest.mark.timeout(20)

SECRET = secrets.token_bytes(32)
FP = (1, 1024, 4, 0, -1)          # ALLREDUCE(count=1024, FP32, SUM)
OTHER = (2, 512, 4, 0, -1)        # ALLGATHER(count=512, FP32)
JOB = "ttest" + secrets.token_hex(3)


from zmq_fixtures import _our_threads, no_leftovers, pyzmq_gc_started, stranger, warnings_of  # noqa: F401 (fixtures)


@pytest.fixture(params=["inproc", "zmq", "shm"])
def kind(request):
    return request.param


@pytest.fixture
def world(kind):
    made = []

    def make(size):
        if kind == "inproc":
            fabric = InprocFabric(size)
            ts = [fabric.transport(r) for r in range(size)]
        elif kind == "zmq":
            ts = [ProcessTransport(r, size, SECRET) for r in range(size)]
            addresses = {t.rank: t.address for t in ts}
            for t in ts:
                t.connect(addresses)
        else:
            if not shm.available():
                pytest.skip("shared memory runs on x86-64 Linux only (shm.available)")
            ts = [ProcessTransport(r, size, SECRET, shm=True, job=JOB) for r in range(size)]
            addresses = {t.rank: t.address for t in ts}
            nodes = {t.rank: t.node for t in ts}
            segments = {t.rank: t.segment for t in ts}
            for t in ts:
                t.connect(addresses, nodes, segments)
                assert len(t.local_peers) == size - 1
            for t in ts:
                t.unlink_segment()
        made.extend(ts)
        return ts
    yield make
    for t in made:
        if isinstance(t, ProcessTransport):
            t.close(linger=0)   # tests leave messages to closed peers queued; do not wait them out
        else:
            t.close()


def arr(view, dtype=np.uint8):
    return np.frombuffer(view, dtype)


# -- data ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, ml_dtypes.bfloat16])
def test_exchange_between_every_pair(world, dtype):
    ts = world(3)
    for src in ts:
        for dst in ts:
            x = (np.arange(100) * (src.rank + 1) + dst.rank).astype(dtype).reshape(10, 10)
            src.send(dst.rank, 1, 1, src.rank, FP, x).wait(5)
    for dst in ts:
        for src in ts:
            got = dst.recv(src.rank, 1, 1, src.rank, FP, 5)
            want = (np.arange(100) * (src.rank + 1) + dst.rank).astype(dtype)
            assert np.array_equal(np.frombuffer(got, dtype), want)
    assert all(t.pending() == 0 for t in ts)


def test_zero_size_and_tiny_payloads(world):
    a, b = world(2)
    a.send(1, 1, 1, 0, FP, np.empty((0, 4), np.float32))
    a.send(1, 1, 1, 1, FP, b"x")
    assert bytes(b.recv(0, 1, 1, 0, FP, 5)) == b""
    assert bytes(b.recv(0, 1, 1, 1, FP, 5)) == b"x"


def test_received_buffer_is_owned_by_the_caller(world):
    a, b = world(2)
    x = np.arange(16, dtype=np.uint8)
    a.send(1, 1, 1, 0, FP, x).wait(5)
    x[:] = 0                                   # reuse after wait: the receiver is unaffected
    got = b.recv(0, 1, 1, 0, FP, 5)
    assert arr(got).tolist() == list(range(16))
    np.frombuffer(got, np.uint8)[0] = 99       # writable, e.g. to reduce into


def test_out_of_order_delivery_across_tags_and_comms(world):
    a, b = world(2)
    tags = [(c, s, st) for c in (1, 2) for s in (1, 2) for st in (0, 1, 2)]
    for i, (c, s, st) in enumerate(tags):
        a.send(1, c, s, st, FP, np.full(8, i, np.uint8))
    for i, (c, s, st) in reversed(list(enumerate(tags))):
        assert arr(b.recv(0, c, s, st, FP, 5)).tolist() == [i] * 8
    assert b.pending() == 0


def test_same_tag_is_fifo(world):
    a, b = world(2)
    for i in range(5):
        a.send(1, 3, 1, 0, FP, bytes([i]))
    assert [bytes(b.recv(0, 3, 1, 0, FP, 5)) for _ in range(5)] == [bytes([i]) for i in range(5)]


def test_concurrent_receivers_on_different_tags(world):
    a, b = world(2)
    n = 6
    results, ready = {}, threading.Barrier(n + 1)

    def rx(i):
        ready.wait()
        results[i] = bytes(b.recv(0, 10 + i, 1, 0, FP, 10))
    threads = [threading.Thread(target=rx, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    for i in reversed(range(n)):
        a.send(1, 10 + i, 1, 0, FP, f"m{i}".encode())
    for t in threads:
        t.join(10)
    assert results == {i: f"m{i}".encode() for i in range(n)}


def test_send_to_self(world):
    (t,) = world(1)
    t.send(0, 1, 1, 0, FP, b"me")
    assert bytes(t.recv(0, 1, 1, 0, FP, 5)) == b"me"


# -- mismatch ------------------------------------------------------------------------------------
def test_fingerprint_mismatch_wakes_a_waiter_at_once(world):
    a, b = world(2)
    errors = []

    def rx():
        try:
            b.recv(0, 1, 12, 3, FP, 30)        # waits for step 3
        except Exception as e:
            errors.append(e)
    t = threading.Thread(target=rx)
    t.start()
    t0 = time.monotonic()
    a.send(1, 1, 12, 0, OTHER, b"x")           # step 0 of another collective, same seq
    t.join(10)
    assert time.monotonic() - t0 < 15          # at once, not after the recv's 30 s (load slack)
    e = errors[0]
    assert isinstance(e, FingerprintMismatch)
    assert (e.peer, e.seq, e.theirs, e.mine) == (0, 12, OTHER, FP)
    assert "seq 12" in str(e)


def test_fingerprint_mismatch_that_arrived_before_recv(world):
    a, b = world(2)
    a.send(1, 1, 5, 0, OTHER, b"early")
    a.send(1, 99, 1, 0, FP, b"marker")         # same link, so the mismatched message is in
    assert bytes(b.recv(0, 99, 1, 0, FP, 5)) == b"marker"
    t0 = time.monotonic()
    with pytest.raises(FingerprintMismatch) as ei:
        b.recv(0, 1, 5, 7, FP, 30)
    assert time.monotonic() - t0 < 15 and ei.value.theirs == OTHER   # not the 30 s timeout
    assert b.recv(0, 1, 5, 0, OTHER, 1) is not None   # matching fp still gets it
    assert b.forget(1) == 0 and b.pending() == 0


def test_mismatch_from_one_peer_does_not_affect_another(world):
    a, b, c = world(3)
    a.send(2, 1, 1, 0, OTHER, b"a")
    b.send(2, 1, 1, 0, FP, b"b")
    assert bytes(c.recv(1, 1, 1, 0, FP, 5)) == b"b"
    with pytest.raises(FingerprintMismatch):
        c.recv(0, 1, 1, 0, FP, 5)


# -- abort, timeout, close -----------------------------------------------------------------------
def test_remote_abort_wakes_every_waiter_with_the_reason(world):
    ts = world(3)
    errors, started = [], threading.Barrier(3)

    def rx(t):
        started.wait()
        try:
            t.recv(0, 5, 1, 0, FP, 30)
        except Exception as e:
            errors.append((t.rank, e))
    threads = [threading.Thread(target=rx, args=(t,)) for t in ts[1:]]
    for t in threads:
        t.start()
    started.wait()
    t0 = time.monotonic()
    ts[0].abort(5, "rank 0 hit a kernel error ✗")
    for t in threads:
        t.join(10)
    assert time.monotonic() - t0 < 15          # the abort, not a 30 s timeout (load slack)
    assert sorted(r for r, _ in errors) == [1, 2]
    for _, e in errors:
        assert isinstance(e, Aborted) and e.peer == 0 and e.reason == "rank 0 hit a kernel error ✗"
    # sticky, for recv and send, on every rank; other comms unaffected
    with pytest.raises(Aborted):
        ts[1].recv(2, 5, 2, 0, FP, 5)
    with pytest.raises(Aborted):
        ts[1].send(2, 5, 2, 0, FP, b"x")
    with pytest.raises(Aborted):
        ts[0].recv(1, 5, 2, 0, FP, 5)
    ts[1].send(2, 6, 1, 0, FP, b"ok")
    assert bytes(ts[2].recv(1, 6, 1, 0, FP, 5)) == b"ok"
    assert ts[2].aborted(5) == (0, "rank 0 hit a kernel error ✗") and ts[2].aborted(6) is None


def test_local_abort_wakes_local_waiters(world):
    a, b = world(2)
    errors, started = [], threading.Event()

    def rx():
        started.set()
        try:
            b.recv(0, 7, 1, 0, FP, 30)
        except Exception as e:
            errors.append(e)
    t = threading.Thread(target=rx)
    t.start()
    started.wait()
    b.abort(7, "watchdog: HCCL_EXEC_TIMEOUT")
    t.join(10)
    assert isinstance(errors[0], Aborted) and errors[0].peer == 1
    with pytest.raises(Aborted, match="watchdog"):
        a.recv(1, 7, 1, 0, FP, 5)


def test_abort_drops_held_messages(world):
    a, b = world(2)
    a.send(1, 8, 1, 0, FP, b"held")
    a.send(1, 99, 1, 0, FP, b"marker")
    b.recv(0, 99, 1, 0, FP, 5)
    assert b.pending() == 1
    b.abort(8, "stop")
    assert b.pending() == 0


def test_timeout_raises_peer_timeout_after_about_the_given_time(world):
    a, b = world(2)
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout) as ei:
        b.recv(0, 1, 1, 0, FP, 0.3)
    waited = time.monotonic() - t0
    # at least the timeout; the upper bounds are load slack
    assert 0.29 <= waited < 10 and ei.value.peer == 0 and 0.29 <= ei.value.waited < 10
    assert isinstance(ei.value, TimeoutError)
    a.send(1, 1, 1, 1, FP, b"other step")
    with pytest.raises(PeerTimeout):           # a message for another tag does not count
        b.recv(0, 1, 1, 0, FP, 0.05)


def test_close_wakes_waiters_and_refuses_later_calls(world):
    a, b = world(2)
    errors, started = [], threading.Event()

    def rx():
        started.set()
        try:
            b.recv(0, 1, 1, 0, FP, 30)
        except Exception as e:
            errors.append(e)
    t = threading.Thread(target=rx)
    t.start()
    started.wait()
    b.close()
    t.join(10)
    assert isinstance(errors[0], TransportClosed)
    with pytest.raises(TransportClosed):
        b.send(0, 1, 1, 0, FP, b"x")
    b.close()                                  # idempotent
    a.send(1, 1, 1, 0, FP, b"to a closed peer")  # the sender is not hurt


def test_forget_drops_leftovers(world):
    a, b, c = world(3)
    for s in (1, 2):
        for st in (0, 1):
            a.send(2, 4, s, st, FP, b"x")
            b.send(2, 4, s, st, FP, b"y")
    a.send(2, 99, 1, 0, FP, b"m")               # markers: everything before them has arrived
    b.send(2, 99, 1, 0, FP, b"m")
    c.recv(0, 99, 1, 0, FP, 5)
    c.recv(1, 99, 1, 0, FP, 5)
    assert c.pending() == 8
    assert c.forget(4, seq=1, peer=0) == 2
    assert c.forget(4, seq=1) == 2
    assert bytes(c.recv(0, 4, 2, 1, FP, 5)) == b"x"
    assert c.forget(4) == 3 and c.pending() == 0


def test_bad_arguments(world):
    a, b = world(2)
    with pytest.raises(ValueError):
        a.send(2, 1, 1, 0, FP, b"x")
    with pytest.raises(ValueError):
        a.recv(-1, 1, 1, 0, FP, 1)
    with pytest.raises(ValueError):
        a.send(1, 1, 1, 0, (1, 2), b"x")
    with pytest.raises(ValueError):
        a.send(1, 1, 1, 0, FP, np.zeros((4, 4))[:, 1])   # not contiguous


def test_large_payload_zero_copy_intact(world, kind):
    a, b = world(2)
    x = np.random.default_rng(0).integers(0, 256, 32 << 20, dtype=np.uint8)
    h = a.send(1, 1, 1, 0, FP, x)
    if kind == "zmq":
        assert h is not DONE                   # tracked, zero-copy
    got = b.recv(0, 1, 1, 0, FP, 10)
    h.wait(10)
    assert h.done()
    assert np.array_equal(arr(got), x)


def test_exceptions_pickle():
    for e in (PeerTimeout(1, 2.5), FingerprintMismatch(0, 12, OTHER, FP), Aborted(3, "why"),
              TransportClosed("closed")):
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is type(e) and str(e2) == str(e) and e2.args == e.args


def test_as_bytes_view():
    assert as_bytes_view(np.zeros((3, 2), np.float32)).nbytes == 24
    assert as_bytes_view(np.zeros(3, ml_dtypes.bfloat16)).nbytes == 6
    assert as_bytes_view(np.zeros((0, 5))).nbytes == 0
    assert as_bytes_view(bytearray(b"abc")).tolist() == [97, 98, 99]
    assert as_bytes_view(memoryview(np.zeros(3, np.int32))).nbytes == 12


# -- ProcessTransport only ---------------------------------------------------------------------------
@pytest.fixture
def zpair():
    a, b = ProcessTransport(0, 2, SECRET), ProcessTransport(1, 2, SECRET)
    addresses = {0: a.address, 1: b.address}
    a.connect(addresses)
    b.connect(addresses)
    yield a, b
    a.close()
    b.close()


def _data(sender, dest, conn, serial, payload=b"p", secret=SECRET, comm_id=1, kind=None):
    return wire.pack(secret, kind or wire.Kind.DATA, sender=sender, dest=dest, conn=conn,
                     serial=serial, comm_id=comm_id, seq=1, step=0, fp=FP, payloads=[payload])


def test_strangers_are_dropped_and_real_traffic_still_works(zpair, stranger, warnings_of):
    a, b = zpair
    records = warnings_of("hccl.transport")
    s = stranger(b.address)
    s.send(b"garbage")
    s.send_multipart([b"", b"\0" * 200])
    s.send_multipart(_data(0, 1, 5, 1, secret=b"wrong key"))          # wrong key
    s.send_multipart(_data(0, 1, 5, 2))                                 # identity mismatch
    hdr, payload = _data(0, 1, 5, 3)
    s.send_multipart([hdr[:-3], payload])                               # truncated
    assert b.drops.wait_for(5, 5)
    assert any("dropped a message" in r.getMessage() for r in records)
    assert b.pending() == 0
    a.send(1, 1, 1, 0, FP, b"real")
    assert bytes(b.recv(0, 1, 1, 0, FP, 5)) == b"real"


def test_replay_and_misaddressed_messages_are_dropped(zpair, stranger):
    a, b = zpair
    conn = 0x5EED
    s = stranger(b.address, identity=wire.routing_id(b"R", 0, conn))
    msg = _data(0, 1, conn, 1, payload=b"once", comm_id=42)
    s.send_multipart(msg)
    assert bytes(b.recv(0, 42, 1, 0, FP, 5)) == b"once"
    s.send_multipart(msg)                                               # replay
    s.send_multipart(_data(0, 0, conn, 2, comm_id=42))                  # addressed to rank 0
    s.send_multipart(_data(1, 1, conn, 3, comm_id=42))                  # claims to be rank 1
    assert b.drops.wait_for(3, 5)
    with pytest.raises(PeerTimeout, match="dropped 3 unauthenticated"):
        b.recv(0, 42, 1, 0, FP, 0.05)
    a.send(1, 42, 2, 0, FP, b"real")
    assert bytes(b.recv(0, 42, 2, 0, FP, 5)) == b"real"


@pytest.mark.parametrize("what", ["store request", "unknown kind", "missing payload"])
def test_a_members_unusable_message_aborts_every_comm_on_every_rank(zpair, stranger, what):
    a, b = zpair
    conn = 0x5EED
    s = stranger(b.address, identity=wire.routing_id(b"R", 0, conn))
    if what == "store request":
        s.send_multipart(wire.pack(SECRET, wire.Kind.SET, sender=0, dest=1, conn=conn, serial=1))
        match = "SET message from rank 0.*not expected"
    elif what == "unknown kind":
        hdr = wire.pack(SECRET, wire.Kind.SET, sender=0, dest=1, conn=conn, serial=1)[0]
        body = bytearray(hdr[:-wire.MAC_SIZE])
        body[5] = 99                                    # the kind byte, then re-signed
        s.send_multipart([bytes(body) + wire._mac(SECRET, bytes(body))])
        match = "message from rank 0: unknown message kind 99"
    else:
        hdr, _ = _data(0, 1, conn, 1)
        s.send_multipart([hdr])                         # the header announces one payload
        match = "message from rank 0: 0 payload frames, header announces 1"
    with pytest.raises(Aborted, match=match):
        b.recv(0, 42, 1, 0, FP, 10)                     # any comm: the world failed
    with pytest.raises(Aborted, match=match):
        a.recv(1, 9, 1, 0, FP, 10)                      # the peer heard it too
    with pytest.raises(Aborted, match=match):
        a.send(1, 3, 1, 0, FP, b"x")
    assert b.drops.dropped == 0


def test_oversized_payload_is_refused_at_send(zpair):
    a, b = zpair
    small = ProcessTransport(0, 2, SECRET, max_message=1024)
    try:
        small.connect({1: b.address})
        with pytest.raises(ValueError, match="slice"):
            small.send(1, 1, 1, 0, FP, np.zeros(1025, np.uint8))
    finally:
        small.close()


def test_close_does_not_wait_for_a_dead_or_missing_peer():
    t = ProcessTransport(0, 2, SECRET)
    nobody = ProcessTransport(1, 2, SECRET)
    address = nobody.address
    nobody.close()                              # the peer is gone before we even connect
    try:
        t.connect({1: address})
        h = t.send(1, 1, 1, 0, FP, np.ones(1 << 20, np.uint8))
        with pytest.raises(PeerTimeout):
            h.wait(0.1)
    finally:
        t0 = time.monotonic()
        t.close(linger=0.2)                     # bounded: the peer will never take the data
        assert time.monotonic() - t0 < 5        # the linger plus load slack, not forever
    h.wait(2)                                   # the dropped message released the buffer


def test_send_before_connect_is_a_clear_error():
    t = ProcessTransport(0, 2, SECRET)
    try:
        with pytest.raises(ValueError, match="connect"):
            t.send(1, 1, 1, 0, FP, b"x")
    finally:
        t.close()
