"""The flight recorder's cheap paths give what the full dump gives."""
import itertools

import pytest

from hccl import diag
from hccl.flight import FlightRecorder
from hccl.types import DataType, Fingerprint, OpType, ReduceOp


class _Comm:
    name, comm_id, rank, ranks = "world", 7, 1, [0, 1, 2]


def _filled(n: int, maxlen: int) -> FlightRecorder:
    """``n`` records through a ring of ``maxlen``: every 5th fails, the last 3 stay in flight."""
    rec = FlightRecorder(maxlen)
    fps = itertools.cycle([Fingerprint.make(OpType.ALLREDUCE, 256, DataType.FP32, ReduceOp.MAX),
                           Fingerprint.make(OpType.BROADCAST, 3, DataType.INT8, None, 2)])
    for seq in range(1, n + 1):
        r = rec.enqueue(_Comm, seq, next(fps), stream="s", site="f.py:1 in g", nbytes=4)
        rec.start(r)
        if seq > n - 3:
            continue
        if seq % 5 == 0:
            rec.fail(r, RuntimeError(f"boom {seq}\nsecond line"))
        else:
            rec.complete(r)
    return rec


@pytest.mark.parametrize("n,maxlen,recent,failed", [(120, 50, 16, 8), (10, 50, 64, 8),
                                                    (120, 50, 0, 0), (0, 50, 64, 8),
                                                    (40, 2000, 64, 3)])
def test_tail_is_the_dump_cut(n, maxlen, recent, failed):
    rec = _filled(n, maxlen)
    full = rec.dump()
    t = rec.tail(recent, failed)
    recs = full["records"]
    assert t["recent"] == (recs[-recent:] if recent else [])
    bad = [r for r in recs if r["state"] == "failed"]
    assert t["failed"] == (bad[-failed:] if failed else [])
    assert t["in_flight"] == full["in_flight"] and t["progress"] == full["progress"]
    if n >= 10:
        assert len(t["in_flight"]) == 3 and t["progress"][0]["last_enqueued"] == n


def test_names_given_or_computed_make_the_same_record():
    rec = FlightRecorder(10)
    for fp in (Fingerprint.make(OpType.ALLREDUCE, 5, DataType.BFP16, ReduceOp.SUM),
               Fingerprint.make(OpType.REDUCE, 5, DataType.FP64, ReduceOp.PROD, 1),
               Fingerprint.make(OpType.BARRIER, 0)):
        a = rec.enqueue(_Comm, 1, fp, stream="s", site="x")
        b = rec.enqueue(_Comm, 1, fp, stream="s", site="x", names=FlightRecorder.names(fp))
        da, db = a.to_dict(), b.to_dict()
        da.pop("t_enqueued"), db.pop("t_enqueued")
        assert da == db
    assert (a.op, a.dtype, a.redop, a.root) == ("BARRIER", "UINT8", None, None)


def test_published_state_keeps_its_recent_and_failed_records(monkeypatch):
    rec = _filled(300, 2000)
    monkeypatch.setattr(diag, "recorder", rec)
    snap = diag.Reporter(None, 0.5).snapshot()
    recs = rec.dump()["records"]
    assert snap["recent"] == recs[-64:]
    assert snap["failed"] == [r for r in recs if r["state"] == "failed"][-8:]
    assert [r["seq"] for r in snap["failed"]] == list(range(260, 300, 5))
    assert len(snap["in_flight"]) == 3


def test_progress_keeps_the_most_recently_used_communicators():
    from hccl import flight

    class C:
        name, rank, ranks = "c", 0, [0, 1]

    rec = FlightRecorder(10)
    fp = Fingerprint.make(OpType.ALLREDUCE, 1, DataType.FP32, ReduceOp.SUM)
    for cid in range(flight.PROGRESS_BOUND + 100):
        C.comm_id = cid
        rec.complete(rec.enqueue(C, 1, fp, stream="s", site="f.py:1 in g"))
        if cid % 10 == 0:           # comm 0 stays in use: never evicted
            C.comm_id = 0
            rec.complete(rec.enqueue(C, cid + 2, fp, stream="s", site="f.py:1 in g"))
    assert len(rec.progress) == flight.PROGRESS_BOUND
    last_use = (flight.PROGRESS_BOUND + 99) // 10 * 10 + 2
    assert rec.last(0, 0) == (last_use, last_use)
    assert rec.last(flight.PROGRESS_BOUND + 99, 0) == (1, 1)
    assert rec.last(1, 0) == (0, 0)              # the oldest unused one was dropped


def test_a_call_done_at_its_issue_leaves_the_record_a_completed_call_leaves():
    fp = Fingerprint.make(OpType.ALLREDUCE, 256, DataType.FP32, ReduceOp.MAX)
    full, once = FlightRecorder(10), FlightRecorder(10)
    for seq in (1, 2):
        r = full.enqueue(_Comm, seq, fp, stream="s", site="f.py:3 in g", nbytes=1024)
        full.start(r)
        full.complete(r)
        once.add(_Comm, seq, FlightRecorder.names(fp), "s", "f.py:3 in g", None, 1024, True)
    a, b = full.dump(), once.dump()
    times = ("t_enqueued", "t_started", "t_completed")
    for ra, rb in zip(a["records"], b["records"]):
        assert rb["t_enqueued"] == rb["t_started"] == rb["t_completed"] is not None
        assert {k: v for k, v in ra.items() if k not in times} == \
            {k: v for k, v in rb.items() if k not in times}
    assert len(b["records"]) == 2 and b["in_flight"] == [] == a["in_flight"]
    assert b["progress"] == a["progress"] == [
        {"comm": "world", "comm_id": 7, "rank": 1, "last_enqueued": 2, "last_completed": 2}]


def test_hccl_enums_hash_as_the_ints_they_equal():
    from hccl.result import Result
    for member in (OpType.ALLREDUCE, ReduceOp.MAX, DataType.FP32, Result.E_PARA):
        assert hash(member) == hash(int(member))
        assert {member: "m"}.get(int(member)) == "m" and {int(member): "i"}[member] == "i"
