"""Prepared ring messages (hccl.transport.shm ``RingWriter`` / ``RingReader``, the pairs'
``sender`` / ``receiver``, the executor's binding of them): the same bytes, answers and errors
as the plain ``post`` / ``take`` / ``send`` / ``try_recv`` they stand for."""
import secrets

import numpy as np
import pytest

from hccl import executor
from hccl.steps import Recv, Send
from hccl.transport import Aborted, TransportClosed, shm
from hccl.transport.base import DONE, FingerprintMismatch
from hccl.transport.process import ProcessTransport
from hccl.types import DataType, ReduceOp

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not shm.available(), reason="no futex / no /dev/shm")]

SECRET = secrets.token_bytes(32)
FP = (1, 16, 4, 0, -1)
SLOT = 256                     # capacity 256 - 96 = 160 bytes
CAP = SLOT - shm.SLOT_HDR_BYTES
JOB = "preptest" + secrets.token_hex(3)
DATA = 1                       # wire.Kind.DATA


@pytest.fixture
def pair():
    a = ProcessTransport(0, 2, SECRET, shm=True, job=JOB, slots=4, slot_bytes=SLOT)
    b = ProcessTransport(1, 2, SECRET, shm=True, job=JOB, slots=4, slot_bytes=SLOT)
    a.connect({1: b.address}, {1: a.node}, {1: b.segment})
    b.connect({0: a.address}, {0: b.node}, {0: a.segment})
    yield a, b
    a.close()
    b.close()


def _f32(n, seed):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _adder(acc):
    """A consumer pair as the executor makes them: into ``acc`` += payload."""
    def consume(view):
        acc += np.frombuffer(view, np.float32)

    def direct(arr):
        np.add(acc, arr, out=acc)
    return consume, (np.dtype(np.float32), direct)


def test_a_prepared_post_is_the_plain_post_and_a_prepared_take_reads_a_plain_one(pair):
    a, b = pair
    pa, pb = a.make_pair(1), b.make_pair(0)
    src = _f32(16, 1)
    send = pa.sender(7, 2, FP, memoryview(src).cast("B"))
    acc = np.zeros(16, np.float32)
    consume, direct = _adder(acc)
    take = pb.receiver(7, 2, FP, 64, consume, direct)
    assert send is not None and take is not None
    for seq in range(1, 31):                           # 4 slots: the ring wraps 7 times
        src[0] = seq
        if seq % 2:                                    # prepared send, plain receive
            assert send(seq) is DONE
            assert bytes(b.recv(0, 7, seq, 2, FP, 5)) == src.tobytes()
        else:                                          # plain send, prepared receive
            assert a.send(1, 7, seq, 2, FP, src) is DONE
            acc[:] = 0
            assert take(seq) is True
            assert np.array_equal(acc, src)
    assert a.ring_sends == 30 and b.pending() == 0


def test_a_prepared_take_leaves_any_other_first_message_in_the_ring(pair):
    a, b = pair
    pb = b.make_pair(0)
    acc = np.zeros(16, np.float32)
    consume, direct = _adder(acc)
    take = pb.receiver(7, 2, FP, 64, consume, direct)
    assert take(5) is False                            # empty: nothing to take, no wait
    x = _f32(16, 2)
    others = [(8, 5, 2, FP, x), (7, 6, 2, FP, x), (7, 5, 3, FP, x), (7, 5, 2, FP, x[:8]),
              (7, 5, 2, (1, 16, 4, 1, -1), x)]   # another comm, seq, step, size, fingerprint
    for comm, seq, step, fp, payload in others:
        a.send(1, comm, seq, step, fp, payload)
        assert take(5) is False                        # another message first: left in place
        if fp != FP:
            with pytest.raises(FingerprintMismatch):
                b.recv(0, comm, seq, step, FP, 5)
        else:
            assert bytes(b.recv(0, comm, seq, step, fp, 5)) == payload.tobytes()
    assert not acc.any()


def test_a_prepared_receive_defers_to_a_message_held_in_the_mailbox(pair):
    a, b = pair
    pb = b.make_pair(0)
    acc = np.zeros(16, np.float32)
    consume, direct = _adder(acc)
    take = pb.receiver(7, 2, FP, 64, consume, direct)
    x, y = _f32(16, 3), _f32(16, 4)
    a.send(1, 7, 5, 1, FP, x)                          # step 1 first, then step 2, same call
    a.send(1, 7, 5, 2, FP, y)
    assert take(5) is False                            # step 1 comes first
    assert bytes(b.recv(0, 7, 5, 1, FP, 5)) == x.tobytes()
    if (0, 7, 5) in b._boxes:                          # step 2 was filed meanwhile:
        assert take(5) is False                        # the mailbox's rules take it
        assert bytes(b.recv(0, 7, 5, 2, FP, 5)) == y.tobytes()
    else:
        assert take(5) is True and np.array_equal(acc, y)


def test_a_prepared_send_falls_back_to_the_plain_send(pair):
    a, b = pair
    pa = a.make_pair(1)
    x = _f32(16, 5)
    send = pa.sender(7, 2, FP, memoryview(x).cast("B"))
    for seq in range(1, 11):                           # 4 slots, nobody reading: the socket
        send(seq)
    assert a.ring_sends == 4
    for seq in range(1, 11):
        assert bytes(b.recv(0, 7, seq, 2, FP, 5)) == x.tobytes()
    a.abort(7, "test abort")
    with pytest.raises(Aborted):
        send(11)
    a.close()
    with pytest.raises(TransportClosed):
        send(12)


def test_what_cannot_be_prepared_is_left_to_the_plain_calls(pair):
    a, b = pair
    lazy = a.pair(1)
    assert lazy.provisional and lazy.sender(7, 2, FP, memoryview(b"x")) is None
    pa, pb = a.make_pair(1), b.make_pair(0)
    assert not pa.provisional
    assert pa.sender(7, 2, FP, memoryview(bytes(CAP))) is not None
    assert pa.sender(7, 2, FP, memoryview(bytes(CAP + 1))) is None    # larger than a slot
    pa.min_notice = 64
    assert pa.sender(7, 2, FP, memoryview(bytes(64))) is None         # announced in place
    consume, direct = _adder(np.zeros(40, np.float32))
    assert pb.receiver(7, 2, FP, CAP, consume, direct) is not None
    assert pb.receiver(7, 2, FP, CAP + 4, consume, direct) is None    # larger than a slot
    assert pb.receiver(7, 2, FP, 6, consume, direct) is None          # not whole float32s
    assert pb.receiver(7, 2, FP, 0, consume, direct) is None
    assert pb.receiver(7, 2, FP, 64, consume, None) is None


def _exchange(t, peer, tag, nbytes=64):
    """A bound send-then-reduce-receive with ``peer`` on a fresh buffer of ``nbytes``."""
    steps = [Send(peer=1 - peer, buf="send", offset=0, nbytes=nbytes, step=0),
             Recv(peer=1 - peer, buf="send", offset=0, nbytes=nbytes, step=0, reduce=True)]
    buf = _f32(nbytes // 4, peer)
    views = executor.prepare_buffers(steps, {"send": buf})
    return executor.bind(steps, views, ReduceOp.SUM, DataType.FP32, [t.pair(0), t.pair(1)],
                         tag), buf


def test_a_program_bound_to_a_pair_not_yet_made_is_provisional(pair):
    a, b = pair
    prog, _ = _exchange(a, 0, (7, FP))
    assert prog.provisional and prog.ops[0].fn is None and prog.ops[1].fn is None
    a.make_pair(1)
    prog, _ = _exchange(a, 0, (7, FP))
    assert not prog.provisional and prog.ops[0].fn is not None and prog.ops[1].fn is not None
    plain, _ = _exchange(a, 0, None)                   # no tag: nothing prepared
    assert not plain.provisional and plain.ops[0].fn is None


def test_bound_programs_exchange_exact_sums_and_refuse_a_wrong_size(pair):
    a, b = pair
    a.make_pair(1), b.make_pair(0)
    pa, xa = _exchange(a, 0, (7, FP))
    pb, xb = _exchange(b, 1, (7, FP))
    for seq in range(1, 20):
        want = xa + xb
        assert pa.begin(7, seq, FP, 5, None) == (1, None)    # sent; stops at its receive
        pb.run(7, seq, FP, 5)
        pa.run(7, seq, FP, 5, None, 1)
        assert np.array_equal(xa, want) and np.array_equal(xb, want)
    steps = [Recv(peer=1, buf="send", offset=0, nbytes=64, step=0, reduce=True)]
    short = executor.bind(steps, executor.prepare_buffers(steps, {"send": np.zeros(16, np.float32)}),
                          ReduceOp.SUM, DataType.FP32, [a.pair(0), a.pair(1)], (7, FP))
    assert short.ops[0].fn is not None
    b.send(0, 7, 50, 0, FP, np.zeros(8, np.float32))         # 32 bytes where 64 are expected
    with pytest.raises(executor.StepFailed, match="rank 1 sent 32 bytes for step 0, expected 64"):
        short.run(7, 50, FP, 5)
