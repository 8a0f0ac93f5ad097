"""launcher.diagnosis.verdict on synthetic rank states: focus, classification, culprits, the report, the
wait-for graph (deadlock) and stale states."""
from launcher.diagnosis.report import format_report, user_threads_first
from launcher.diagnosis.verdict import (RankInfo, classify, cycle_key, find_cycle,
                              wait_edges)

TIMEOUT = {"kind": "timeout", "type": "HcclTimeoutError", "text": "[rank 0] timed out"}
RELEASED = {"kind": "released", "type": "RemoteRankError", "text": "aborted"}


def rec(seq, op="ALLREDUCE", count=1024, dtype="FP32", redop="SUM", state="started",
        waiting_for=None, comm="world", comm_id=7, members=(0, 1, 2, 3), t=100.0, error=None,
        error_type=None):
    return {"comm": comm, "comm_id": comm_id, "seq": seq, "op": op, "count": count,
            "dtype": dtype, "redop": redop, "root": None, "peer": None, "stream": "default stream",
            "state": state, "t_enqueued": t, "t_started": t, "t_completed": t + 5 if state == "failed" else None,
            "site": "train.py:10 in step", "waiting_for": waiting_for, "waiting_since": t,
            "error": error, "error_type": error_type, "members": list(members)}


def st(records, last_enq, last_done, comm_id=7, time=None):
    return {"time": time, "interval": 0.5, "node": "1", "host": "n1",
            "in_flight": [r for r in records if r["state"] in ("enqueued", "started")],
            "failed": [r for r in records if r["state"] == "failed"], "recent": records,
            "progress": [{"comm": "world", "comm_id": comm_id, "last_enqueued": last_enq,
                          "last_completed": last_done}]}


def test_sleeping_rank_is_the_culprit_not_the_first_to_time_out():
    timeout = "HcclTimeoutError: [rank 0] ALLREDUCE ... timed out"
    infos = [
        RankInfo(0, st([rec(5, state="failed", waiting_for=3, error=timeout,
                            error_type="HcclTimeoutError")], 5, 4), exit=1, error=TIMEOUT),
        RankInfo(1, st([rec(5, state="failed", waiting_for=0, error="RemoteRankError: x",
                            error_type="RemoteRankError")], 5, 4), exit=1, error=RELEASED),
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


def test_a_rank_that_failed_with_an_hccl_error_and_then_died_by_a_signal_is_not_dead():
    # torch aborts the interpreter's teardown now and then after an exception: the rank had
    # already failed with the mismatch error, so the mismatch stays the verdict
    three = (0, 1, 2)
    mismatch = {"kind": "mismatch", "type": "CollectiveMismatchError", "text": "[rank 2] mismatch"}
    infos = [RankInfo(r, st([rec(3, op="ALLGATHER" if r == 1 else "ALLREDUCE", members=three,
                                  redop=None if r == 1 else "SUM", state="failed")], 3, 2),
                      exit=1, error=mismatch) for r in range(3)]
    infos[2].exit = -6
    v = classify(infos)
    assert v["reason"] == "mismatch" and v["culprits"] == [1], v["verdict"]
    assert v["ranks"]["2"]["state"] != "dead"
    infos[2].error = None                      # no error first: the signal is the cause
    v = classify(infos)
    assert v["reason"] == "dead" and v["ranks"]["2"]["state"] == "dead"


def test_a_rank_released_by_the_abort_before_it_entered_is_not_a_culprit():
    """The mismatch was seen and the communicator aborted while rank 2 was still on its way:
    its own call then failed at once, and it exited with an hccl error."""
    infos = [RankInfo(0, st([rec(3)], 3, 2)),
             RankInfo(1, st([rec(3, op="ALLGATHER", redop=None)], 3, 2)),
             RankInfo(2, st([], 2, 2), exit=1, error=RELEASED),
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
    assert v["reason"] == "dead" and v["culprits"] == [0] and v["comm"] is None


def test_user_threads_first_drops_npusim_daemons():
    dump = ('Thread 0x2 (most recent call first):\n  File "/x/hccl/diag.py", line 9 in _run\n\n'
            'Current thread 0x1 (most recent call first):\n  File "a.py", line 1 in main')
    assert user_threads_first(dump).startswith("Current thread") and "diag.py" not in user_threads_first(dump)


def test_a_rank_that_exited_with_a_plain_exception_is_an_error_and_typed_fields_decide():
    """The error file's kind decides, not its text: a ValueError whose message mentions
    HcclTimeoutError is still the rank's own error, the root cause."""
    three = (0, 1, 2)
    infos = [RankInfo(0, st([rec(2, waiting_for=1, members=three)], 2, 1)),
             RankInfo(1, st([], 1, 1), exit=1, error={"kind": "error", "type": "ValueError",
                                                      "text": "HcclTimeoutError in my config"}),
             RankInfo(2, st([rec(2, waiting_for=1, members=three)], 2, 1))]
    v = classify(infos)
    assert v["reason"] == "error" and v["culprits"] == [1]
    assert v["ranks"]["1"]["state"] == "error"
    assert "ValueError: HcclTimeoutError in my config" in v["ranks"]["1"]["detail"]


def test_a_stale_state_is_unreachable_never_alive():
    """Ranks 2 and 3 live on a node whose link was cut: their last states are 40 s old."""
    infos = [RankInfo(0, st([rec(5, waiting_for=2)], 5, 4, time=1000.0)),
             RankInfo(1, st([rec(5, waiting_for=0)], 5, 4, time=1000.0)),
             RankInfo(2, st([], 4, 4, time=960.0)),
             RankInfo(3, st([rec(5, waiting_for=2)], 5, 4, time=960.0))]
    v = classify(infos, now=1000.5)
    assert {r: e["state"] for r, e in v["ranks"].items()} == \
        {"0": "waiting", "1": "waiting", "2": "unreachable", "3": "unreachable"}
    assert v["culprits"] == [2, 3]
    d = v["ranks"]["2"]["detail"]
    assert "unreachable since 40 s" in d and "node 1 (n1)" in d and "alive" not in \
        d.replace("not known to be alive", "")
    # a fresh state of the same rank is classified as before: alive, in user code
    infos[2] = RankInfo(2, st([], 4, 4, time=999.9))
    v = classify(infos, now=1000.5)
    assert v["ranks"]["2"]["state"] == "not_entered" and "alive" in v["ranks"]["2"]["detail"]


def _deadlock_infos():
    """Ranks 0 and 1 share the world (id 7) and a sub-comm (id 9), called in opposite orders;
    ranks 2 and 3 wait in the world for rank 1's ring neighbour."""
    world, sub = (0, 1, 2, 3), (0, 1)
    return [RankInfo(0, st([rec(2, waiting_for=3)], 2, 1)),
            RankInfo(1, {"in_flight": [rec(1, comm="sub", comm_id=9, members=sub,
                                           waiting_for=0)], "failed": [], "recent": [],
                         "progress": [{"comm_id": 7, "last_enqueued": 1, "last_completed": 1},
                                      {"comm_id": 9, "last_enqueued": 1,
                                       "last_completed": 0}]}),
            RankInfo(2, st([rec(2, waiting_for=1)], 2, 1)),
            RankInfo(3, st([rec(2, waiting_for=2)], 2, 1))]


def test_a_cycle_across_communicators_is_a_deadlock():
    infos = _deadlock_infos()
    edges = {(e["rank"], e["waits_for"]) for e in wait_edges(infos)}
    # rank 1 has not entered world seq 2: everyone in it waits for rank 1 (not its neighbour);
    # rank 0 has not entered sub seq 1: rank 1 waits for rank 0
    assert edges == {(0, 1), (2, 1), (3, 1), (1, 0)}
    cycle = find_cycle(infos)
    assert [(e["rank"], e["comm"], e["seq"], e["waits_for"]) for e in cycle] == \
        [(0, "world", 2, 1), (1, "sub", 1, 0)]
    assert cycle_key(cycle) == cycle_key(find_cycle(_deadlock_infos()))     # stable
    v = classify(infos, cycle=cycle)
    assert v["reason"] == "deadlock" and v["culprits"] == [0, 1]
    assert [e["rank"] for e in v["cycle"]] == [0, 1]
    assert set(v["other_ranks"]) == {"2", "3"}
    text = format_report(v)
    assert "wait-for cycle: rank 0 (world seq 2) -> rank 1 (sub seq 1) -> rank 0" in text


def test_no_cycle_when_the_blocker_is_in_user_code():
    infos = _deadlock_infos()
    infos[1] = RankInfo(1, st([], 1, 1))          # rank 1 sleeps in user code: no edge out
    assert find_cycle(infos) is None
    assert classify(infos)["culprits"] == [1]     # the timeout path's verdict


def test_report_folds_npusim_frames_and_prefers_a_culprits_traceback():
    dump = ('Current thread 0x1 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
            f'  File "{__import__("launcher").__file__.rsplit("/", 2)[0]}/hccl/comm.py", line 9 in x\n'
            '  File "train.py", line 3 in step\n\n'
            'Thread 0x2 [npu0-default stream] (most recent call first):\n'
            f'  File "{__import__("launcher").__file__.rsplit("/", 2)[0]}/runtime/stream.py", '
            'line 107 in _work\n  File "/usr/lib/python3.11/threading.py", line 982 in run')
    out = user_threads_first(dump)
    assert out.splitlines() == ["Current thread 0x1 (most recent call first):",
                                "  ... 2 frame(s) of npusim", '  File "train.py", line 3 in step']


def test_a_local_rank_npurun_sees_running_is_not_unreachable():
    infos = [RankInfo(0, st([rec(5, waiting_for=1, members=(0, 1))], 5, 4, time=1000.0)),
             RankInfo(1, st([], 4, 4, time=900.0), alive=True)]
    v = classify(infos, now=1000.5)
    assert v["ranks"]["1"]["state"] == "not_entered" and v["culprits"] == [1]


def test_a_tie_of_records_is_broken_by_the_calls_the_mismatch_errors_compared():
    """Ranks 2 and 3 were released (still in seq 1) before they called seq 2: only ranks 0 and 1
    published a seq 2 record. Rank 2's mismatch error compared its own call with rank 1's."""
    infos = [RankInfo(0, st([rec(2)], 2, 1)),
             RankInfo(1, st([rec(2, count=512)], 2, 1)),
             RankInfo(2, st([], 1, 1), exit=1, error={
                 "kind": "mismatch", "type": "CollectiveMismatchError", "text": "x",
                 "ranks": [2, 1], "calls": ["ALLREDUCE(count=1024, FP32, SUM)",
                                            "ALLREDUCE(count=512, FP32, SUM)"]}),
             RankInfo(3, st([], 1, 1), exit=1, error=RELEASED)]
    v = classify(infos)
    assert v["reason"] == "mismatch" and v["culprits"] == [1], v["ranks"]
    assert v["ranks"]["0"]["state"] == "waiting"
    infos[2] = RankInfo(2, st([], 1, 1), exit=1, error=RELEASED)    # nothing to break the tie
    v = classify(infos)
    assert v["culprits"] == [0, 1]
    assert v["verdict"] == (
        "rank 0 called ALLREDUCE(count=1024, FP32, SUM) at seq 2; rank 1 called "
        "ALLREDUCE(count=512, FP32, SUM) at seq 2; no majority among the calls made, so any of "
        "ranks [0, 1] may be the odd one (ranks that never called it have no vote)")


ERROR = {"kind": "error", "type": "InvalidArgumentError", "site": "train.py:7 in step",
         "text": "all_reduce: send holds 400 bytes but count=1000 elements of FP32 need 4000"}


def test_a_rank_whose_own_code_raised_is_the_error_culprit_and_the_released_are_victims():
    three = (0, 1, 2)
    infos = [RankInfo(0, st([rec(2, waiting_for=1, members=three, state="failed",
                                 error_type="RemoteRankError")], 2, 1), exit=1, error=RELEASED),
             RankInfo(1, st([], 1, 1), exit=1, error=ERROR),
             RankInfo(2, st([rec(2, waiting_for=0, members=three)], 2, 1))]
    v = classify(infos)
    assert v["reason"] == "error" and v["culprits"] == [1], v
    assert v["ranks"]["1"]["state"] == "error"
    assert v["ranks"]["1"]["detail"] == (f"raised InvalidArgumentError: {ERROR['text']} at "
                                         "train.py:7 in step; it never called seq 2 of world")
    assert v["verdict"].startswith("rank 1 raised InvalidArgumentError: all_reduce")
    assert v["verdict"].endswith("rank(s) [0, 2] only waited for it (victims, not causes)")
    assert "none found" not in format_report(v)


def test_no_collective_in_flight_still_names_the_error_never_none_found():
    """The others had not reached a collective when rank 1 raised: class error all the same;
    a rank released by the abort is 'released', not 'completed'."""
    v = classify([RankInfo(0, st([], 1, 1), exit=1, error=RELEASED),
                  RankInfo(1, st([], 1, 1), exit=1, error=ERROR),
                  RankInfo(2, st([], 1, 1), exit=0), RankInfo(3, st([], 1, 1), alive=True)])
    assert v["reason"] == "error" and v["culprits"] == [1] and v["comm"] is None
    assert {r: e["state"] for r, e in v["ranks"].items()} == {
        "0": "released", "1": "error", "2": "completed", "3": "running"}
    assert "culprit rank(s): [1]" in format_report(v)
    quiet = classify([RankInfo(0, st([], 1, 1), alive=True)])
    assert quiet["reason"] is None and quiet["culprits"] == []


def test_an_error_outside_the_stuck_communicator_is_a_culprit_too():
    infos = [RankInfo(0, st([rec(1, members=(0, 2), comm="sub", comm_id=9)], 1, 0, comm_id=9)),
             RankInfo(1, None, exit=1, error=ERROR),
             RankInfo(2, st([], 0, 0, comm_id=9), alive=True)]
    v = classify(infos)
    assert v["culprits"] == [2, 1] and v["reason"] == "error", v
    assert v["ranks"]["1"]["state"] == "error" and "1" not in v["other_ranks"]


def p2p(op, peer, seq, state, members=(0, 1)):
    r = rec(seq, op=op, redop=None, state=state, members=members)
    r["peer"] = peer
    return r


def test_a_receive_posted_before_the_send_on_both_ranks_is_a_cycle():
    infos = [RankInfo(r, st([p2p("RECV", 1 - r, 1, "started"), p2p("SEND", 1 - r, 1, "enqueued")],
                            0, 0)) for r in (0, 1)]
    cyc = find_cycle(infos)
    assert cyc is not None and sorted((e["rank"], e["waits_for"]) for e in cyc) == [(0, 1), (1, 0)]
    v = classify(infos, cycle=cyc)
    assert v["reason"] == "deadlock" and v["culprits"] == [0, 1]
    assert "post one side's send before its receive" in v["verdict"]
    assert "across communicators" not in v["verdict"]
    # rank 1's send has started: rank 0's receive is served, no edge, no cycle
    infos[1] = RankInfo(1, st([p2p("SEND", 0, 1, "started"), p2p("RECV", 0, 1, "enqueued")], 0, 0))
    assert not wait_edges(infos) and find_cycle(infos) is None


def test_ranks_text_and_the_notice_name_the_culprit_first():
    from launcher.diagnosis.report import format_notice, ranks_text
    assert [ranks_text(r) for r in ([2], [0, 1], [1, 2, 3], [0, 2, 3, 4, 7])] == [
        "rank 2", "ranks 0, 1", "ranks 1-3", "ranks 0, 2-4, 7"]
    infos = [RankInfo(0, st([rec(2, waiting_for=3)], 2, 1)), RankInfo(1, st([rec(2)], 2, 1)),
             RankInfo(2, st([rec(2)], 2, 1)), RankInfo(3, st([], 1, 1), alive=True)]
    edges = wait_edges(infos)
    assert {(e["rank"], e["waits_for"]) for e in edges} == {(0, 3), (1, 3), (2, 3)}
    stall = {"comm": "world", "comm_id": 7, "seq": 2, "op": "ALLREDUCE(count=1024, FP32, SUM)",
             "since": 100.0, "waiters": [0, 1, 2], "blockers": [3]}
    stack = ('Current thread 0x1 (most recent call first):\n'
             '  File "train.py", line 40 in save_checkpoint\n  File "train.py", line 9 in main')
    text = format_notice(stall, classify(infos, now=115.0), [3], {3: stack}, now=115.0,
                         settings="NPUSIM_HANG_NOTICE=15")
    first = text.splitlines()[0]
    assert first.startswith("npurun: notice: rank 3 has not called seq 2 of world "
                            "(ALLREDUCE(count=1024, FP32, SUM)) for 15 s; ranks 0-2 wait for it")
    assert "  rank 3: not_entered: never called seq 2 (last enqueued seq 1); alive" in text
    assert text.index("----- Python stacks of rank 3 (now) -----") < text.index("save_checkpoint")


def _peer_killed(survivors_exit=1):
    """Rank 1 SIGKILLed mid-backward (the torch DDP case of issue 40): the survivors were
    released in seq 102 (their later buckets queued behind it); rank 1's last published state,
    an interval older than its death, still says seq 86."""
    three = (0, 1, 2)
    def survivor(r):
        recs = [rec(102, members=three, state="failed", waiting_for=1, t=200.0,
                    error_type="RemoteRankError")]
        recs += [rec(s, members=three, state="enqueued", t=200.0) for s in range(103, 107)]
        return RankInfo(r, st(recs, 106, 101, time=205.0), exit=survivors_exit,
                        error=RELEASED if survivors_exit else None)
    dead = RankInfo(1, st([rec(s, members=three, state="enqueued", t=199.0)
                           for s in range(82, 87)], 86, 81, time=199.5), exit=-9)
    return [survivor(0), dead, survivor(2)]


def test_a_peer_killed_mid_backward_is_the_only_culprit_and_its_stale_seq_is_unknown():
    v = classify(_peer_killed(), now=210.0)
    assert v["reason"] == "dead" and v["culprits"] == [1] and v["seq"] == 102, v["verdict"]
    dead = v["ranks"]["1"]
    assert dead["state"] == "dead" and dead["seq"] is None
    assert dead["detail"] == ("killed by SIGKILL; its last seq is unknown: its last published "
                              "state (seq 86 enqueued, 81 completed) is older than the others' "
                              "progress (seq 101 completed)")
    assert {v["ranks"][r]["state"] for r in ("0", "2")} == {"waiting"}
    assert v["verdict"].endswith("rank(s) [0, 2] only waited for it (victims, not causes)")
    # before the survivors exit (the verdict npurun takes first): their records queued behind
    # the failed seq are not where they wait, and they are no culprits
    v = classify(_peer_killed(survivors_exit=None), now=210.0)
    assert v["culprits"] == [1] and v["seq"] == 102, v["verdict"]


def test_a_dead_rank_the_others_wait_for_was_in_that_seq():
    three = (0, 1, 2)
    infos = [RankInfo(0, st([rec(3, members=three, waiting_for=1)], 3, 2)),
             RankInfo(1, st([rec(3, members=three, t=99.0)], 3, 2), exit=-9),
             RankInfo(2, st([rec(3, members=three, waiting_for=1)], 3, 2))]
    v = classify(infos)
    assert v["culprits"] == [1] and v["ranks"]["1"]["seq"] == 3
    assert v["ranks"]["1"]["detail"] == ("killed by SIGKILL; it was in ALLREDUCE(count=1024, "
                                         "FP32, SUM) seq 3")
    infos[1] = RankInfo(1, st([], 2, 2), exit=-9)     # it never published seq 3
    v = classify(infos)
    assert v["culprits"] == [1] and v["ranks"]["1"]["detail"] == (
        "killed by SIGKILL; its last published state: seq 2 enqueued, seq 2 completed")
    infos[1] = RankInfo(1, None, exit=-9)
    assert classify(infos)["ranks"]["1"]["detail"] == (
        "killed by SIGKILL; its last seq is unknown (it published no state)")


def test_peers_that_exited_0_are_not_culprits_of_a_dead_rank():
    """Rank 1 was killed after its last collective; its peers finished and exited 0, their
    published states an interval old (one still shows a collective in flight)."""
    three = (0, 1, 2)
    infos = [RankInfo(0, st([rec(147, members=three, waiting_for=1)], 151, 146), exit=0),
             RankInfo(1, st([rec(147, members=three, t=99.0)], 151, 146), exit=-9),
             RankInfo(2, st([], 140, 140), exit=0)]
    v = classify(infos)
    assert v["culprits"] == [1], v["verdict"]
    assert {r: e["state"] for r, e in v["ranks"].items()} == {
        "0": "completed", "1": "dead", "2": "completed"}
    assert "unknown" in v["ranks"]["1"]["detail"] and "exited 0" in v["ranks"]["1"]["detail"]
    assert "victims" not in v["verdict"]
    # without a rank failed by itself, a rank that exited 0 and never called the seq the others
    # wait in is the culprit (it skipped it)
    hang = [RankInfo(0, st([rec(5, members=three, waiting_for=2)], 5, 4)),
            RankInfo(1, st([rec(5, members=three, waiting_for=2)], 5, 4)),
            RankInfo(2, st([], 4, 4), exit=0)]
    v = classify(hang)
    assert v["culprits"] == [2] and "exited 0 without calling it" in v["ranks"]["2"]["detail"]


def test_a_live_view_says_no_timeout_before_one_happened():
    three = (0, 1, 2)
    infos = [RankInfo(0, st([rec(2, members=three, waiting_for=2)], 2, 1), alive=True),
             RankInfo(1, st([rec(2, members=three, waiting_for=0)], 2, 1), alive=True),
             RankInfo(2, st([], 1, 1), alive=True)]
    v = classify(infos, now=150.0)
    assert v["reason"] is None and v["culprits"] == [2]
    assert format_report(v, now=150.0).splitlines()[1] == "npusim job verdict"
    infos[0] = RankInfo(0, st([rec(2, members=three, waiting_for=2, state="failed",
                                   error_type="HcclTimeoutError")], 2, 1), exit=1, error=TIMEOUT)
    assert classify(infos, now=150.0)["reason"] == "timeout"
