"""The verdict of a big job of subgroups, from synthetic published states (no processes): the
layout of examples/parallel_groups.py (tp 4 x pp 4 x dp N/16) with rank 37 stopped in user
code before its TP AllReduce of step 1. Its TP group waits for it, its stage's DP groups wait
for the TP group, every PP group waits for a rank of that stage, and the ranks of the later
stages that got through wait in the world's BARRIER for ranks held in those groups: every rank
is in a different (seq, op, waiting-for) state, and any of these collectives may time out first.
The report must name rank 37, its group and its stack once, in at most 60 lines with the
failure summary, at world 128 and 256 (#39)."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

from launcher.diagnosis import verdict
from launcher.agent.diagnose import Diagnoser
from launcher.diagnosis.report import BIG_LINES, format_report
from launcher.diagnosis.summary import Culprit, ProcessFailure, format_story
from launcher.diagnosis.verdict import RankInfo, classify

HUNG = 37
STACK = ('Current thread 0x00007f0000000001 (most recent call first):\n'
         '  File "/x/examples/parallel_groups.py", line 97 in main\n'
         '  File "/x/examples/parallel_groups.py", line 125 in <module>\n')
TIMEOUT = {"kind": "timeout", "type": "HcclTimeoutError", "text": "timed out after 30.0 s"}
RELEASED = {"kind": "released", "type": "RemoteRankError", "text": "aborted: rank 2 timed out"}


def _load_example():
    """examples/parallel_groups.py as a module: its layout is the one the real jobs use."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "parallel_groups.py")
    spec = importlib.util.spec_from_file_location("npusim_example_parallel_groups", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_EXAMPLE = _load_example()


def layout(world: int, tp: int = 4, pp: int = 4) -> dict:
    return _EXAMPLE.layout(world, tp, pp)


def _comm(kind: str, i: int, ranks: list[int]) -> tuple[str, int]:
    return (f"world.sub{ranks}", {"tp": 100, "dp": 200, "pp": 300}[kind] + i)


def _rec(comm, cid, seq, op, members, state, waiting_for, t, error_type=None):
    return {"comm": comm, "comm_id": cid, "seq": seq, "op": op, "count": 256, "dtype": "FP32",
            "redop": "SUM" if op == "ALLREDUCE" else None, "root": 0 if op == "BROADCAST" else None,
            "peer": None, "stream": "default stream", "state": state, "t_enqueued": t,
            "t_started": t, "waiting_since": t, "t_completed": t + 30 if state == "failed" else None,
            "site": "parallel_groups.py:100 in main", "waiting_for": waiting_for,
            "error": f"{error_type}: x" if error_type else None, "error_type": error_type,
            "members": list(members)}


def job(world: int, barrier_first: bool, live: bool = False) -> list[RankInfo]:
    """Every rank's published state at the verdict (after npurun's abort): see the module note.
    ``barrier_first``: the world's BARRIER timed out before the TP group did (the run that
    made the old report 129 lines long); ``live``: the states while the job waits (every
    record started, every rank alive), as the hang notice sees them."""
    g = layout(world)
    comms = {}          # rank -> {kind: (comm, cid, members)}
    for kind, groups in g.items():
        for i, ranks in enumerate(groups):
            name, cid = _comm(kind, i, ranks)
            for r in ranks:
                comms.setdefault(r, {})[kind] = (name, cid, ranks)
    stage = world // 4
    hung_stage = HUNG // stage
    other_stage = 1 - hung_stage        # one more stage held (its PP broadcasts wait)
    held_tp = next(rs for rs in g["tp"] if HUNG in rs)
    t_tp = 100.0
    t_barrier = 90.0 if barrier_first else 110.0
    infos = []
    for r in range(world):
        mine = comms[r]
        progress = [{"comm": n, "comm_id": c, "last_enqueued": 1, "last_completed": 1}
                    for n, c, _ in mine.values()]
        progress.append({"comm": "world", "comm_id": 1, "last_enqueued": 0, "last_completed": 0})
        recs, err, exit_code = [], None, 1
        if r == HUNG:
            exit_code = None            # alive, in user code: no record in flight
        elif r in held_tp:
            n, c, ms = mine["tp"]
            typ = "HcclTimeoutError" if r == held_tp[0] else "RemoteRankError"
            recs.append(_rec(n, c, 2, "ALLREDUCE", ms, "failed", ms.index(HUNG), t_tp + r % 3,
                             typ))
            err = TIMEOUT if typ == "HcclTimeoutError" else RELEASED
        elif r // stage == hung_stage:  # the hung rank's stage: its DP groups wait
            n, c, ms = mine["dp"]
            typ = ("HcclTimeoutError", "RemoteRankError")[r % 2]
            recs.append(_rec(n, c, 2, "ALLREDUCE", ms, "failed", (r * 7) % len(ms),
                             t_tp + 1 + r % 5, typ))
            err = TIMEOUT if r % 2 == 0 else RELEASED
        elif r // stage == other_stage:   # its PP broadcasts wait for the hung stage
            n, c, ms = mine["pp"]
            recs.append(_rec(n, c, 2, "BROADCAST", ms, "failed", 1, t_tp + 2 + r % 7,
                             "RemoteRankError"))
            err = RELEASED
        else:                           # later stages got through: the world's barrier
            members = list(range(world))
            state = "failed" if r % 3 else "started"
            typ = ("HcclTimeoutError" if r % 3 == 1 else "RemoteRankError") if r % 3 else None
            recs.append(_rec("world", 1, 1, "BARRIER", members, state, (r * 5) % stage,
                             t_barrier + r % 11, typ))
            err = None if state == "started" else TIMEOUT if typ == "HcclTimeoutError" else RELEASED
            exit_code = None if state == "started" else 1
            for p in progress[:-1]:     # its 3 steps done: seqs 1-3 of each of its groups
                p["last_enqueued"] = p["last_completed"] = 3
            progress[-1]["last_enqueued"] = 1
        if live:
            for x in recs:
                x.update(state="started", t_completed=None, error=None, error_type=None)
            exit_code, err = None, None
        st = {"time": 200.0, "interval": 0.5, "node": "0", "host": "h",
              "in_flight": [x for x in recs if x["state"] in ("enqueued", "started")],
              "failed": [x for x in recs if x["state"] == "failed"], "recent": recs,
              "progress": progress}
        infos.append(RankInfo(r, st, exit_code, err, STACK if r == HUNG else None,
                              alive=exit_code is None))
    return infos


def _story(tmp_path, world: int, v: dict) -> str:
    fails = []
    for r in range(world):
        e = v["ranks"].get(str(r)) or {}
        if r == HUNG or e.get("exit") in (None, 0) and str(r) in v["ranks"]:
            continue
        typ = "RemoteRankError" if r % 2 else "HcclTimeoutError"
        path = tmp_path / f"e{r}.json"
        path.write_text(json.dumps({"message": {"message": f"{typ}: [rank {r}] x"},
                                    "error": {"kind": "released" if r % 2 else "timeout",
                                              "type": typ, "rank": r,
                                              "text": f"[rank {r}] ALLREDUCE timed out"},
                                    "timestamp": 1000.0 + r}))
        fails.append(ProcessFailure(rank=r, local_rank=r, pid=100 + r, exitcode=1,
                                    error_file=str(path), observed_at=1000.0 + r))
    c = Culprit(rank=HUNG, state=v["ranks"][str(HUNG)]["state"],
                detail=v["ranks"][str(HUNG)]["detail"], local_rank=HUNG, pid=1, stopped=True)
    return format_story("npurun parallel_groups.py", v["reason"], [c], fails,
                        tracebacks="/nowhere/<local_rank>/traceback.log")


def _check(text: str, story: str) -> None:
    lines = text.splitlines()
    assert len(lines) <= BIG_LINES, text
    # npurun prints the report, the summary and 3 lines of its own (report path, logs, ...)
    assert len(lines) + len(story.splitlines()) + 3 <= 60, text + "\n" + story
    assert "culprit rank(s): [37]" in text
    assert "world.sub[36, 37, 38, 39]" in text, text          # the hung rank's TP group
    assert text.count("Python stacks of culprit rank 37") == 1
    assert text.count("parallel_groups.py\", line 97 in main") == 1, text
    assert max(len(l) for l in lines + story.splitlines()) <= 400, text + "\n" + story
    assert "npurun exits with 1 (culprit rank 37: not_entered)" in story


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [128, 256])
def test_the_focus_is_the_group_the_hung_rank_holds_up_even_when_the_barrier_fails_first(
        tmp_path, world):
    v = classify(job(world, barrier_first=True), now=240.0)
    assert v["comm"] == "world.sub[36, 37, 38, 39]" and v["seq"] == 2, v["comm"]
    assert v["culprits"] == [HUNG]
    text = format_report(v, now=240.0)
    _check(text, _story(tmp_path, world, v))
    assert f"communicator world.sub[36, 37, 38, 39] (ranks [36, 37, 38, 39]), seq 2" in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [128, 256])
def test_a_verdict_on_the_world_barrier_stays_short_and_names_the_group(tmp_path, world,
                                                                        monkeypatch):
    """The focus on the world's barrier itself (as before the focus looked for where the wait
    chain ends): 64-192 ranks not entered in many ways, the others waiting for many ranks."""
    monkeypatch.setattr(verdict, "_roots", lambda infos, candidates: set())
    v = classify(job(world, barrier_first=True), now=240.0)
    assert v["comm"] == "world" and v["op"] == "BARRIER()" and v["culprits"] == [HUNG]
    assert len({(e["state"], e["seq"], e["op"], e["waiting_for"], e["detail"])
                for e in v["ranks"].values()}) > world // 4       # many distinct states
    text = format_report(v, now=240.0)
    _check(text, _story(tmp_path, world, v))
    assert f"communicator world (ranks 0-{world - 1}), seq 1: BARRIER()" in text
    held = [l for l in text.splitlines() if l.startswith("rank 37 also holds up: ")]
    assert len(held) == 1 and "world.sub[36, 37, 38, 39] seq 2" in held[0], text


@pytest.mark.timeout(120)
def test_the_report_is_bounded_when_every_rank_is_in_a_state_of_its_own():
    """512 ranks, each with its own op, error and detail, 100 culprits with stacks: still at
    most BIG_LINES lines, every culprit counted."""
    ranks = {}
    for r in range(512):
        culprit = r % 5 == 0 and r < 500
        ranks[str(r)] = {"state": "not_entered" if culprit else "waiting", "seq": r,
                         "op": f"OP{r}(count={r})", "waiting_for": (r + 1) % 512, "since": 1.0,
                         "site": None, "exit": r, "error": f"E{r}: text {r}",
                         "detail": f"detail {r} " * 40, "traceback": None,
                         "stack": STACK if culprit else None}
    culprits = [r for r in range(500) if r % 5 == 0]
    v = {"reason": "timeout", "comm": "world", "members": list(range(512)), "seq": 3,
         "op": "BARRIER()", "culprits": culprits, "ranks": ranks,
         "other_ranks": {str(r): {"state": f"exit {r}", "exit": r} for r in range(512, 700)},
         "verdict": "rank 0 never called seq 3; " * 100, "time": 2.0,
         "holds_up": {str(c): [{"comm": f"c{i}", "seq": i, "op": "X",
                                "waiters": list(range(300))} for i in range(9)]
                      for c in culprits[:3]}}
    deep = "Current thread 0x1 (most recent call first):\n" + "".join(
        f'  File "/x/user.py", line {i} in f{i}\n' for i in range(60))
    for c in culprits:
        ranks[str(c)]["stack"] = deep
    text = format_report(v, now=5.0)
    lines = text.splitlines()
    assert len(lines) <= BIG_LINES, text
    assert max(len(l) for l in lines) <= 700, text
    assert lines[4].endswith(f"... ({len(culprits)} ranks)"), lines[4]
    assert text.count("Python stacks of culprit rank") == 1
    assert "(the stacks of the other culprits: hang_report.json)" in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [128, 256])
def test_the_hang_notice_names_the_group_where_the_waits_end(world):
    """The world's barrier has waited longest, for 64 ranks that wait in their own groups: the
    notice names the TP group and rank 37, not the barrier and its 64 missing ranks."""
    infos = job(world, barrier_first=True, live=True)
    stall = Diagnoser._stall(infos)
    assert (stall["comm"], stall["seq"], stall["blockers"]) == ("world.sub[36, 37, 38, 39]", 2,
                                                                [HUNG]), stall
    assert stall["waiters"] == [36, 38, 39]
    assert verdict.find_cycle(infos) is None
    v = classify(infos, now=240.0)
    assert v["comm"] == "world.sub[36, 37, 38, 39]" and v["culprits"] == [HUNG] and v["reason"] is None


class _Agent:
    """What Diagnoser uses of npurun's agent in a notice (no processes)."""

    def __init__(self):
        self.before_stop, self.on_tick, self.verdict_hooks = [], [], []
        self.status_requested = False
        self.job = type("Job", (), {"node_rank": 0, "world_size": 128})()

    def live_workers(self):
        return []


@pytest.mark.timeout(120)
def test_a_notice_due_between_two_polls_reads_only_the_ranks_of_its_stall(monkeypatch):
    """A full poll of 128 states took 5-15 s on a loaded machine: the notice falls due between
    two, after a read of the 4 ranks of the stall, not of all 128."""
    import launcher.agent.api
    said, read = [], []
    monkeypatch.setattr(launcher.agent.api, "say", said.append)
    infos = job(128, barrier_first=True, live=True)
    for i in infos:
        for r in i.state["in_flight"]:
            r["waiting_since"] = r["t_started"] = r["t_started"] + 900.0   # 1000 s: wait from 1000
    d = Diagnoser(_Agent(), "/nonexistent")
    d._poll_took = 8.0
    d._notice(infos, now=1005.0)                      # the TP group has waited 5 s
    assert said == [] and d._pending[1] == 1015.0
    states = {i.rank: i.state for i in infos}

    def read_states(ranks):
        read.append(list(ranks))
        return {r: states[r] for r in ranks}
    monkeypatch.setattr(d, "read_states", read_states)
    d._next_poll = 0.0
    monkeypatch.setattr("time.time", lambda: 1010.0)  # due in 5 s < a full poll's 8 s: wait
    assert d.on_tick(d.agent) is None and read == [] and said == []
    monkeypatch.setattr("time.time", lambda: 1015.2)
    assert d.on_tick(d.agent) is None
    assert read == [[36, 37, 38, 39]], read
    assert len(said) == 1 and "rank 37 has not called seq 2 of world.sub[36, 37, 38, 39]" in \
        said[0] and "for 15 s; ranks 36, 38, 39 wait for it" in said[0], said
    d.close()
