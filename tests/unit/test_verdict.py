"""launcher.verdict on synthetic rank states: focus, classification, culprits, the report."""
from launcher.verdict import RankInfo, classify, format_report, user_threads_first


def rec(seq, op="ALLREDUCE", count=1024, dtype="FP32", redop="SUM", state="started",
        waiting_for=None, comm="world", comm_id=7, members=(0, 1, 2, 3), t=100.0, error=None):
    return {"comm": comm, "comm_id": comm_id, "seq": seq, "op": op, "count": count,
            "dtype": dtype, "redop": redop, "root": None, "peer": None, "stream": "default stream",
            "state": state, "t_enqueued": t, "t_started": t, "t_completed": t + 5 if state == "failed" else None,
            "site": "train.py:10 in step", "waiting_for": waiting_for, "waiting_since": t,
            "error": error, "members": list(members)}


def st(records, last_enq, last_done, comm_id=7):
    return {"in_flight": [r for r in records if r["state"] in ("enqueued", "started")],
            "failed": [r for r in records if r["state"] == "failed"], "recent": records,
            "progress": [{"comm": "world", "comm_id": comm_id, "last_enqueued": last_enq,
                          "last_completed": last_done}]}


def test_sleeping_rank_is_the_culprit_not_the_first_to_time_out():
    timeout = "HcclTimeoutError: [rank 0] ALLREDUCE ... timed out"
    infos = [
        RankInfo(0, st([rec(5, state="failed", waiting_for=3, error=timeout)], 5, 4), exit=1,
                 error="TaskError[HcclTimeoutError]: [rank 0] timed out"),
        RankInfo(1, st([rec(5, state="failed", waiting_for=0, error="RemoteRankError: x")], 5, 4), exit=1,
                 error="TaskError[RemoteRankError]: aborted"),
        RankInfo(2, st([], 4, 4), stack="Current thread 0x1:\n  File \"x.py\", line 3 in load_batch"),
        RankInfo(3, st([rec(5, waiting_for=2)], 5, 4)),
    ]
    v = classify(infos, now=200.0)
    assert v["culprits"] == [2] and v["reason"] == "timeout" and v["seq"] == 5
    assert {r: e["state"] for r, e in v["ranks"].items()} == \
        {"0": "waiting", "1": "waiting", "2": "not_entered", "3": "waiting"}
    assert v["ranks"]["3"]["waiting_for"] == 2
    text = format_report(v, now=200.0)
    assert "culprit rank(s): [2]" in text and "load_batch" in text


def test_mismatch_minority_is_culprit_and_dead_beats_everything():
    three = (0, 1, 2)
    infos = [RankInfo(r, st([rec(3, op="ALLGATHER" if r == 1 else "ALLREDUCE", members=three,
                                  redop=None if r == 1 else "SUM")], 3, 2)) for r in range(3)]
    v = classify(infos)
    assert v["reason"] == "mismatch" and v["culprits"] == [1]
    assert v["ranks"]["1"]["state"] == "mismatch"
    infos[2] = RankInfo(2, st([rec(3, members=three)], 3, 2), exit=-9)
    v = classify(infos)
    assert v["ranks"]["2"]["state"] == "dead" and 2 in v["culprits"]
    assert "killed by SIGKILL" in v["ranks"]["2"]["detail"]


def test_a_rank_released_by_the_abort_before_it_entered_is_not_a_culprit():
    """The mismatch was seen and the communicator aborted while rank 2 was still on its way:
    its own call then failed at once, and it exited with an hccl error."""
    infos = [RankInfo(0, st([rec(3)], 3, 2)),
             RankInfo(1, st([rec(3, op="ALLGATHER", redop=None)], 3, 2)),
             RankInfo(2, st([], 2, 2), exit=1,
                      error="TaskError[RemoteRankError]: communicator aborted by rank 0"),
             RankInfo(3, st([rec(3)], 3, 2))]
    v = classify(infos)
    assert v["reason"] == "mismatch" and v["culprits"] == [1]
    assert v["ranks"]["2"]["state"] == "not_entered"
    assert "released by the failure of another rank" in v["ranks"]["2"]["detail"]
    infos[2] = RankInfo(2, st([], 2, 2))             # alive and still in user code: a culprit
    assert classify(infos)["culprits"] == [1, 2]


def test_completed_and_enqueued_but_not_started():
    three = (0, 1, 2)
    infos = [RankInfo(0, st([rec(2, waiting_for=1, members=three)], 2, 1)),
             RankInfo(1, st([rec(2, state="enqueued", members=three)], 2, 1)),
             RankInfo(2, st([rec(2, state="completed", members=three)], 2, 2))]
    v = classify(infos)
    states = {r: e["state"] for r, e in v["ranks"].items()}
    assert states == {"0": "waiting", "1": "not_entered", "2": "completed"}
    assert "never started" in v["ranks"]["1"]["detail"] and v["culprits"] == [1]


def test_no_collective_and_dead_rank_outside_any():
    v = classify([RankInfo(0, None, exit=-9), RankInfo(1, None)])
    assert v["reason"] == "dead_rank" and v["culprits"] == [0] and v["comm"] is None


def test_user_threads_first_drops_npusim_daemons():
    dump = ('Thread 0x2 (most recent call first):\n  File "/x/hccl/diag.py", line 9 in _run\n\n'
            'Current thread 0x1 (most recent call first):\n  File "a.py", line 1 in main')
    assert user_threads_first(dump).startswith("Current thread") and "diag.py" not in user_threads_first(dump)
