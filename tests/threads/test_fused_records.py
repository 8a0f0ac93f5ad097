"""A fused group's flight records: one per member, with its own seq, site and count, sharing
the group's state (hccl.flight.FlightRecorder.group)."""
import numpy as np
import pytest

import hccl
import runtime
from hccl.flight import Member, Record, recorder

pytestmark = pytest.mark.timeout(120)


def _records(comm, first, last):
    return [r for r in recorder.dump()["records"]
            if r["comm_id"] == comm.comm_id and r["rank"] == comm.rank
            and first <= r["seq"] <= last]


def test_a_fused_replay_leaves_a_record_per_member(ranks):
    counts = [16, 3, 64]

    def body(comm):
        s = runtime.Stream()
        xs = [runtime.to_device(np.ones(n, np.float32)) for n in counts]
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            for x in xs:
                comm.all_reduce(x, stream=s)
        out = []
        for _ in range(3):
            before = recorder.last(comm.comm_id, comm.rank)[0]
            g.replay(s)
            s.synchronize()
            after = recorder.last(comm.comm_id, comm.rank)
            out.append((before, after, _records(comm, before + 1, after[0])))
        live = [r for r in recorder.in_flight()
                if r["comm_id"] == comm.comm_id and r["rank"] == comm.rank]
        return len(g), out, live, [x.to_host()[0] for x in xs]

    for length, out, live, vals in ranks(2, body):
        assert length == 1 and live == [] and vals == [8.0, 8.0, 8.0]
        for before, (enq, done), recs in out:
            assert enq == done == before + 3
            assert [r["seq"] for r in recs] == [before + 1, before + 2, before + 3]
            assert [r["count"] for r in recs] == counts
            assert {r["state"] for r in recs} == {"completed"}
            assert len({(r["t_started"], r["t_completed"]) for r in recs}) == 1
            assert all("test_fused_records.py" in r["site"] for r in recs)


def test_a_failed_fused_group_fails_every_member():
    from hccl.flight import FlightRecorder

    class C:
        name, comm_id, rank, ranks = "c", 9, 0, [0, 1]

    rec = FlightRecorder(16)
    protos = tuple(rec.proto(C, ("ALLREDUCE", n, "FP32", "SUM", None), "s", None, 4 * n)
                   for n in (1, 2, 3))
    recs = rec.group(protos, ("a:1", "b:2", "c:3"), 5)
    assert type(recs[0]) is Record and all(type(m) is Member for m in recs[1:])
    assert [r.seq for r in recs] == [5, 6, 7] and rec.last(9, 0) == (7, 0)
    assert len(rec.in_flight()) == 3
    rec.start(recs[0])
    assert {r.state for r in recs} == {"started"}
    for r in recs:
        rec.fail(r, RuntimeError("lost\nmore"))
    d = rec.dump()
    assert [r["state"] for r in d["records"]] == ["failed"] * 3
    assert [r["count"] for r in d["records"]] == [1, 2, 3]
    assert [r["site"] for r in d["records"]] == ["a:1", "b:2", "c:3"]
    assert {r["error"] for r in d["records"]} == {"RuntimeError: lost"}
    assert d["in_flight"] == [] and rec.last(9, 0) == (7, 0)
    recs = rec.group(protos, ("a:1", "b:2", "c:3"), 8)
    rec.complete_group(recs)
    assert rec.last(9, 0) == (10, 10) and rec.in_flight() == []
    assert recs[1] != recs[2] and hash(recs[1]) != hash(Member(tuple(recs[1])))
