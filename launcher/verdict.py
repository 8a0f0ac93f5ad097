"""The job verdict: classify every rank of a hung or failed job and name the culprits.

Design note. Input is what npurun knows of each rank: the state it published (flight-recorder
records and per-communicator progress, see ``hccl.diag``), whether its process is alive or how
it exited, the first line of its error file, and its Python stacks. The *focus* is the
collective the job is stuck in: the one whose failure came first (a timeout or a mismatch, not
an abort that only echoes another rank's failure), else the oldest in-flight one. Every member of
that communicator is then:

- ``dead``: its process is gone by a signal, or by an exit that was not an hccl error;
- ``completed``: it finished that seq;
- ``mismatch``: it called a different collective (op, count, dtype, reduce op, root) at that seq
  than the majority of ranks;
- ``not_entered``: alive (or exited 0) and never started that seq: still in user code, or its
  collective sits on a stream blocked before it (an event never reached, a stuck kernel);
- ``waiting``: inside the collective, waiting for a peer (which one, since when).

Culprits are the dead, mismatched and not-entered ranks; if every rank is waiting, the ranks the
others wait for. This is what the per-rank watchdogs cannot tell: the first rank to time out is a
victim, and the rank it names is only its ring neighbour.
"""
from __future__ import annotations

import collections
import signal as _signal
import time
from dataclasses import dataclass

STATES = ("completed", "waiting", "not_entered", "dead", "mismatch")
_HCCL_ERRORS = ("HcclTimeoutError", "CollectiveMismatchError", "RemoteRankError", "HcclError",
                "TaskError[")
_STACK_LINES = 40


@dataclass
class RankInfo:
    rank: int
    state: dict | None = None        # published state (hccl.diag), None if none was seen
    exit: int | None = None          # None while alive; returncode otherwise (negative: signal)
    error: str | None = None         # "Type: message" from the error file
    stack: str | None = None         # Python stacks taken on request


def _records(st: dict | None) -> list[dict]:
    if not st:
        return []
    out, seen = [], set()
    for key in ("in_flight", "failed", "recent"):
        for r in st.get(key) or ():
            k = (r.get("comm_id"), r.get("seq"), r.get("peer"), r.get("t_enqueued"))
            if k not in seen:
                seen.add(k)
                out.append(r)
    return [r for r in out if r.get("peer") is None]      # point-to-point has its own seq


def _is_echo(rec: dict) -> bool:
    """A failure that only repeats another rank's (an abort received from a peer)."""
    return (rec.get("error") or "").startswith("RemoteRankError")


def _fp(rec: dict) -> tuple:
    return (rec.get("op"), rec.get("count"), rec.get("dtype"), rec.get("redop"), rec.get("root"))


def describe_call(rec: dict) -> str:
    if rec.get("op") == "BARRIER":
        return "BARRIER()"
    parts = [f"count={rec.get('count')}", str(rec.get("dtype"))]
    if rec.get("redop"):
        parts.append(str(rec["redop"]))
    if rec.get("root") is not None:
        parts.append(f"root={rec['root']}")
    return f"{rec.get('op')}({', '.join(parts)})"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "alive"
    if code < 0:
        try:
            return f"killed by {_signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _focus(infos: list[RankInfo]) -> dict | None:
    failed, inflight = [], []
    for info in infos:
        for r in _records(info.state):
            if r.get("state") == "failed":
                failed.append(r)
            elif r.get("state") in ("enqueued", "started"):
                inflight.append(r)
    primary = [r for r in failed if not _is_echo(r)]
    for group, key in ((primary, "t_completed"), (inflight, "t_enqueued"), (failed, "t_completed")):
        if group:
            return min(group, key=lambda r: (r.get(key) or 0, r.get("seq") or 0))
    return None


def _dead(info: RankInfo) -> bool:
    if info.exit is None or info.exit == 0:
        return False
    if info.exit < 0:
        return True
    return not any(h in (info.error or "") for h in _HCCL_ERRORS)


def classify(infos: list[RankInfo], *, now: float | None = None) -> dict:
    """The verdict as a JSON-able dict (see the module note); ``infos`` covers every rank."""
    now = time.time() if now is None else now
    focus = _focus(infos)
    by_rank = {i.rank: i for i in infos}
    if focus is None:
        dead = [i.rank for i in infos if _dead(i)]
        ranks = {str(i.rank): _entry("dead" if _dead(i) else "completed", i, None, None) for i in infos}
        return {"reason": "dead_rank" if dead else "no_collective", "comm": None, "seq": None,
                "op": None, "members": sorted(by_rank), "culprits": dead, "ranks": ranks,
                "other_ranks": {}, "verdict": (f"rank(s) {dead} died outside any collective" if dead
                                               else "no collective was in flight"), "time": now}
    cid, seq, members = focus.get("comm_id"), focus.get("seq"), focus.get("members") or sorted(by_rank)
    recs = {}
    for info in infos:
        for r in _records(info.state):
            if r.get("comm_id") == cid and r.get("seq") == seq:
                recs[info.rank] = r
    votes = collections.Counter(_fp(r) for r in recs.values())
    top = votes.most_common()
    majority = top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None
    ranks, culprits = {}, []
    for g in members:
        info = by_rank.get(g, RankInfo(g))
        rec = recs.get(g)
        done = _progress(info.state, cid)
        if _dead(info):
            detail = describe_exit(info.exit)
            if info.error:
                detail += f" ({info.error})"
            if rec is not None and rec.get("state") != "completed":
                detail += f"; it was in {describe_call(rec)} seq {seq}"
            ranks[str(g)] = _entry("dead", info, rec, detail, members)
        elif done[1] >= seq or (rec is not None and rec.get("state") == "completed"):
            ranks[str(g)] = _entry("completed", info, rec, f"completed seq {seq}", members)
        elif rec is not None and majority is not None and _fp(rec) != majority:
            ranks[str(g)] = _entry("mismatch", info, rec, f"called {describe_call(rec)} at seq {seq}",
                                   members)
        elif rec is not None and majority is None and len(votes) > 1:
            ranks[str(g)] = _entry("mismatch", info, rec, f"called {describe_call(rec)} at seq {seq}",
                                   members)
        elif rec is not None and rec.get("state") == "enqueued":
            ranks[str(g)] = _entry("not_entered", info, rec,
                                   f"enqueued {describe_call(rec)} seq {seq} on {rec.get('stream')} at "
                                   f"{rec.get('site')} but the stream never started it: work before it "
                                   "on that stream is blocked", members)
        elif rec is not None:
            ranks[str(g)] = _entry("waiting", info, rec, None, members)
        else:
            released = info.exit not in (None, 0)     # an hccl error (else it would be dead)
            where = ("exited 0 without calling it" if info.exit == 0 else
                     f"it failed before calling it, released by the failure of another rank "
                     f"({info.error or describe_exit(info.exit)})" if released else
                     "alive, still in user code")
            ranks[str(g)] = _entry("not_entered", info, None,
                                   f"never called seq {seq} (last enqueued seq {done[0]}); {where}",
                                   members)
            if released:                  # a victim of the abort, not a cause of the hang
                continue
        if ranks[str(g)]["state"] in ("dead", "mismatch", "not_entered"):
            culprits.append(g)
    if not culprits:
        waited = collections.Counter(e["waiting_for"] for e in ranks.values()
                                     if e["state"] == "waiting" and e["waiting_for"] is not None)
        if waited:
            n = max(waited.values())
            culprits = sorted(r for r, c in waited.items() if c == n)
    states = {e["state"] for e in ranks.values()}
    reason = ("dead_rank" if "dead" in states else "mismatch" if "mismatch" in states else "timeout")
    others = {str(i.rank): {"state": "dead" if _dead(i) else describe_exit(i.exit), "exit": i.exit}
              for i in infos if i.rank not in members}
    return {"reason": reason, "comm": focus.get("comm"), "comm_id": cid, "members": members,
            "seq": seq, "op": describe_call(focus), "culprits": culprits, "ranks": ranks,
            "other_ranks": others,
            "verdict": _headline(culprits, ranks, seq, focus, _call_of(majority, recs)),
            "time": now}


def _progress(st, cid) -> tuple[int, int]:
    for p in (st or {}).get("progress") or ():
        if p.get("comm_id") == cid:
            return int(p.get("last_enqueued") or 0), int(p.get("last_completed") or 0)
    return 0, 0


def name_threads(stack: str | None, names: dict | None) -> str | None:
    """Add each thread's name (from the rank's published state) to faulthandler's dump."""
    if not stack or not names:
        return stack
    out = []
    for line in stack.splitlines():
        for prefix in ("Thread ", "Current thread "):
            if line.startswith(prefix):
                tid = line[len(prefix):].split(" ", 1)[0]
                if tid in names:
                    line = line.replace(tid, f"{tid} [{names[tid]}]", 1)
        out.append(line)
    return "\n".join(out)


def _entry(state, info: RankInfo, rec, detail, members=None) -> dict:
    waiting_for = since = None
    if rec is not None and state == "waiting":
        w = rec.get("waiting_for")
        if w is not None and members and 0 <= w < len(members):
            waiting_for = members[w]
        since = rec.get("waiting_since") or rec.get("t_started")
    return {"state": state, "seq": rec.get("seq") if rec else None,
            "op": describe_call(rec) if rec else None, "waiting_for": waiting_for, "since": since,
            "site": rec.get("site") if rec else None, "exit": info.exit, "error": info.error,
            "detail": detail,
            "stack": name_threads(info.stack, (info.state or {}).get("threads"))}


def _call_of(fp, recs: dict) -> str | None:
    for r in recs.values():
        if _fp(r) == fp:
            return describe_call(r)
    return None


def _headline(culprits, ranks, seq, focus, majority_call) -> str:
    if not culprits:
        return f"every rank is waiting in {describe_call(focus)} seq {seq}; no culprit found"
    parts = []
    for c in culprits:
        e = ranks[str(c)]
        if e["state"] == "dead":
            parts.append(f"rank {c} is dead ({e['detail']})")
        elif e["state"] == "mismatch":
            others = f"the others called {majority_call}" if majority_call else "the calls disagree"
            parts.append(f"rank {c} {e['detail']}; {others}")
        elif e["state"] == "not_entered":
            parts.append(f"rank {c} {e['detail']}")
        else:
            parts.append(f"rank {c} is waited for by the others")
    return "; ".join(parts)


_INTERNAL_THREADS = ("hccl/diag.py", "hccl/transport/zmq.py", "hccl/store.py")


def user_threads_first(stack: str) -> str:
    """faulthandler's dump with the main thread first and npusim's daemon threads left out
    (the rank's reporter, transport receiver and store threads say nothing about the hang)."""
    blocks = [b for b in stack.strip().split("\n\n") if b.strip()]
    main = [b for b in blocks if b.lstrip().startswith("Current thread")]
    rest = [b for b in blocks if b not in main and not any(t in b for t in _INTERNAL_THREADS)]
    return "\n\n".join(main + rest)


def format_report(v: dict, *, now: float | None = None, stacks: bool = True) -> str:
    """The one report npurun prints: culprits first, then the table, then the culprits' stacks."""
    now = time.time() if now is None else now
    bar = "=" * 78
    lines = [bar, "npusim job verdict" + (f": {v['reason']}" if v.get("reason") else ""), bar]
    if v.get("comm") is not None:
        lines.append(f"communicator {v['comm']} (ranks {v['members']}), seq {v['seq']}: {v['op']}")
    lines.append(f"culprit rank(s): {v['culprits'] if v['culprits'] else 'none found'}")
    lines.append(f"verdict: {v['verdict']}")
    lines.append("")
    lines.append(f"{'rank':>5}  {'state':<12} {'seq':>5}  {'op':<40} {'waiting for':<12} {'since':>8}")
    for r, e in sorted(v["ranks"].items(), key=lambda kv: int(kv[0])):
        since = f"{now - e['since']:.1f} s" if e.get("since") else "-"
        wf = f"rank {e['waiting_for']}" if e.get("waiting_for") is not None else "-"
        op = e.get("op") or "-"
        lines.append(f"{r:>5}  {e['state']:<12} {e['seq'] if e['seq'] is not None else '-':>5}  "
                     f"{op[:40]:<40} {wf:<12} {since:>8}")
        if e.get("detail") and e["state"] != "waiting":
            lines.append(f"{'':>7}{e['detail']}")
    for r, e in sorted((v.get("other_ranks") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"{r:>5}  (not a member of {v['comm']}: {e['state']})")
    if stacks:
        for c in v["culprits"]:
            st = (v["ranks"].get(str(c)) or {}).get("stack")
            if st:
                body = user_threads_first(st).strip().splitlines()
                more = len(body) - _STACK_LINES
                lines.append(f"----- Python stacks of culprit rank {c} -----")
                lines.extend(body[:_STACK_LINES])
                if more > 0:
                    lines.append(f"... ({more} more lines in hang_report.json)")
    lines.append(bar)
    return "\n".join(lines)
