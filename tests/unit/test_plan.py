"""hccl.plan: one home for the per-call caches, values immutable, bounded, cleared by clear()."""
import dataclasses
import hashlib
import hmac

import pytest

from hccl import plan, schedule, wire
from hccl.transport.base import norm_fp
from hccl.types import DataType, OpType, ReduceOp

SHAPE = (OpType.ALLREDUCE, 1, 4, 300, DataType.FP32, ReduceOp.SUM, None, None, False, "ring",
         1 << 20)


@pytest.fixture(autouse=True)
def empty():
    plan.clear()
    yield
    plan.clear()


def test_a_shape_is_planned_once_and_the_plan_is_immutable():
    p = plan.collective(*SHAPE)
    assert plan.collective(*SHAPE) is p
    assert plan.sizes()["plans"] == 1
    assert list(p.steps) == schedule.ring_all_reduce(1, 4, 300, 4, 1 << 20)
    assert dict(p.nbytes) == {"send": 1200, "recv": 1200}
    assert p.steps.reduces is True and p.fp == p.rec_fp
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.steps = ()
    with pytest.raises(TypeError):
        p.nbytes["send"] = 0
    with pytest.raises(TypeError):
        p.steps.extents["recv"] = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.steps.reduces = False
    assert isinstance(p.steps.steps, tuple)


def test_send_and_recv_share_the_wire_fingerprint_not_the_recorders():
    s = plan.collective(OpType.SEND, 0, 2, 10, DataType.INT32, None, None, 1, False, "ring", 4096)
    r = plan.collective(OpType.RECV, 1, 2, 10, DataType.INT32, None, None, 0, False, "ring", 4096)
    assert s.fp == r.fp and s.rec_fp != r.rec_fp


def test_bad_arguments_raise_and_are_not_cached():
    bad = list(SHAPE)
    bad[9] = "no-such-algo"
    with pytest.raises(Exception, match="no-such-algo"):
        plan.collective(*bad)
    assert plan.sizes()["plans"] == 0


def test_clear_empties_every_cache_and_the_next_call_rebuilds_an_equal_plan():
    p = plan.collective(*SHAPE)
    norm_fp((1, 2, 3, 4, 5))
    wire.pack(b"k" * 32, list(wire.Kind)[0], sender=0, dest=1, conn=0, serial=1)
    assert all(n >= 1 for n in plan.sizes().values()), plan.sizes()
    plan.clear()
    assert set(plan.sizes().values()) == {0}
    q = plan.collective(*SHAPE)
    assert q is not p and q == p


def test_a_memo_is_bounded_and_empties_whole_when_full():
    m = plan.Memo("test-bound", 3)
    try:
        for i in range(3):
            m.put(i, str(i))
        assert len(m) == 3 and m.get(0) == "0"
        m.put(3, "3")
        assert len(m) == 1 and m.get(0) is None and m.get(3) == "3"
        with pytest.raises(ValueError, match="bound=0"):
            plan.Memo("zero", 0)
    finally:
        plan._MEMOS.remove(m)


def test_the_keyed_mac_matches_hmac_digest():
    key = b"s" * 32
    for serial in (1, 2):
        header = bytes(wire.pack(key, list(wire.Kind)[0], sender=0, dest=1, conn=0,
                                 serial=serial)[0])
        body, mac = header[:-wire.MAC_SIZE], header[-wire.MAC_SIZE:]
        assert mac == hmac.digest(key, body, hashlib.sha256)
    assert plan.sizes()["macs"] == 1
