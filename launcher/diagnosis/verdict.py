"""The job verdict: classify every rank of a hung or failed job and name the culprits.

Design note. Input is what npurun knows of each rank: the state it published (flight-recorder
records and per-communicator progress, see ``hccl.diag``), whether its process is alive or how
it exited, the first line of its error file, and its Python stacks. The *focus* is the
collective the job is stuck in: the one whose failure came first (a timeout or a mismatch, not
an abort that only echoes another rank's failure), else the oldest in-flight one. Every member of
that communicator is then:

- ``dead``: its process is gone by a signal, or by an exit that was not an hccl error; where
  it was comes from its last published state, up to an interval older than its death: when
  the others got further than that state (``_last_position``), its position is unknown;
- ``completed``: it finished that seq, or it exited 0 (what it called completed) when another
  rank died or failed by itself;
- ``mismatch``: it called a different collective (op, count, dtype, reduce op, root) at that seq
  than the majority of ranks;
- ``not_entered``: alive (or exited 0) and never started that seq: still in user code, or its
  collective sits on a stream blocked before it (an event never reached, a stuck kernel);
- ``waiting``: inside the collective, waiting for a peer (which one, since when);
- ``unreachable``: its process is not known to have ended, but its published state stopped
  refreshing (a lost node, a cut link): classified by the age of that state, never as alive.

Culprits are the dead, mismatched, not-entered and unreachable ranks; if every rank is waiting,
the ranks the others wait for. A *deadlock* (``find_cycle``) is a cycle in the wait-for graph
across communicators: a rank waiting in a collective waits for the members that have not
entered it (else for the peer it waits on); the ranks of the cycle are the culprits.

Failures are read from typed fields (the error file's ``error`` record, the flight record's
``error_type``), never from message text. This is what the per-rank watchdogs cannot tell: the first rank to time out is a
victim, and the rank it names is only its ring neighbour.
"""
from __future__ import annotations

import collections
import time

from hccl.failure import Failure
from launcher.diagnosis.rankinfo import STALE_MIN, RankInfo, describe_call, records, state_age
from launcher.diagnosis.report import name_threads, short_ranks
# the deadlock's graph is the verdict's too: ``classify(infos, cycle=find_cycle(infos))``
from launcher.diagnosis.waitfor import cycle_key, find_cycle, wait_edges
from launcher.errors import describe_exit

__all__ = ["CLASSES", "STALE_MIN", "STATES", "RankInfo", "classify", "cycle_key", "describe_call",
           "find_cycle", "held_in", "state_age", "wait_edges"]

STATES = ("completed", "waiting", "not_entered", "error", "dead", "mismatch", "unreachable",
          "released", "running")
# a verdict's class (its "reason"), first match wins: what the culprits did
CLASSES = (Failure.DEAD, Failure.ERROR, Failure.MISMATCH, Failure.UNREACHABLE)
HEADLINE_CULPRITS = 4     # more culprits than this: the first ones in words, the rest as ranges


def _is_echo(rec: dict) -> bool:
    """A failure that only repeats another rank's (an abort received from a peer)."""
    return rec.get("error_type") == "RemoteRankError"


def _fp(rec: dict) -> tuple:
    return (rec.get("op"), rec.get("count"), rec.get("dtype"), rec.get("redop"), rec.get("root"))


def _focus(infos: list[RankInfo]) -> dict | None:
    """The record the job is stuck in. A published state is a snapshot up to an interval old, so
    the in-flight records of a rank whose process has ended say where it was some time before
    it ended: they come last, after what the ranks still running wait in and where the
    released ones were caught. A rank that exited 0 finished what it called, and a record
    queued behind a failed one never runs: neither is in flight."""
    failed, live, ended = [], [], []
    for info in infos:
        recs = records(info.state)
        # a record queued behind a failed one of its communicator never runs (the stream
        # skips it, the communicator is aborted): not where the rank waits
        behind = {}
        for r in recs:
            if r.get("state") == "failed":
                failed.append(r)
                cid = r.get("comm_id")
                behind[cid] = min(behind.get(cid, r.get("seq") or 0), r.get("seq") or 0)
        for r in recs:
            if r.get("state") not in ("enqueued", "started") or info.exit == 0:
                continue
            if (r.get("seq") or 0) > behind.get(r.get("comm_id"), float("inf")):
                continue
            (live if info.exit is None else ended).append(r)
    primary = [r for r in failed if not _is_echo(r)]
    roots = _roots(infos, primary + live + failed + ended)
    for group, key in ((primary, "t_completed"), (live, "t_enqueued"), (failed, "t_completed"),
                       (ended, "t_enqueued")):
        if roots:
            group = [r for r in group if (r.get("comm_id"), r.get("seq")) in roots]
        if group:
            return min(group, key=lambda r: (r.get(key) or 0, r.get("seq") or 0))
    return None


def held_in(infos: list[RankInfo], states=("enqueued", "started", "failed")) -> dict:
    """{rank: comm_ids of the collectives it is held in}: records in ``states``, of the ranks
    that did not end by themselves (dead, failed in their own code, exited 0)."""
    held: dict = {}
    for info in infos:
        if _dead(info) or _own_error(info) or info.exit == 0:
            continue
        for r in records(info.state):
            if r.get("state") in states:
                held.setdefault(info.rank, set()).add(r.get("comm_id"))
    return held


def _roots(infos: list[RankInfo], candidates: list[dict]) -> set:
    """The (comm_id, seq) of the candidate collectives where a wait chain ends: the members
    that have not started it are not held in another collective themselves (they are in their
    own code, dead, or failed by themselves). In a big job the waits spread: the ranks of a subgroup wait for a
    rank in user code, their other groups wait for them, and the world's barrier waits for
    those, and any of these may time out first; the barrier's missing members only wait
    elsewhere, so it is not where the job is stuck. Empty when no candidate is such an end
    (then the first failure or the oldest wait is the focus, as before)."""
    seen = {(i.rank, r.get("comm_id"), r.get("seq")): r.get("state")
            for i in infos for r in records(i.state)}
    held = held_in(infos)
    by_rank = {i.rank: i for i in infos}
    out, done = set(), set()
    for c in candidates:
        key = (c.get("comm_id"), c.get("seq"))
        if key in done:
            continue
        done.add(key)
        cid, seq = key
        absent = [m for m in c.get("members") or ()
                  if seen.get((m, cid, seq)) not in ("started", "completed", "failed")
                  and m in by_rank and _progress(by_rank[m].state, cid)[1] < (seq or 0)]
        if absent and not any(held.get(m, set()) - {cid} for m in absent):
            out.add(key)
    return out


def _dead(info: RankInfo) -> bool:
    """Whether the rank died: it exited non-zero or by a signal without a Python exception
    first. One that recorded an exception and then died by a signal (npurun stopping it, or
    torch aborting the interpreter's teardown, as it does now and then after an exception) had
    already failed for that exception."""
    if info.exit is None or info.exit == 0:
        return False
    return info.kind is None or info.kind is Failure.DEAD


def _own_error(info: RankInfo) -> bool:
    """Whether the rank ended because its own code raised (not a collective's failure)."""
    return info.exit not in (None, 0) and info.kind is Failure.ERROR


def _error_detail(info: RankInfo, seq=None, comm=None, rec=None) -> str:
    """One line: what the rank's code raised, where, and where that left it."""
    e = info.error or {}
    text = f"raised {info.error_line}"
    if e.get("site"):
        text += f" at {e['site']}"
    if rec is not None and rec.get("state") != "completed":
        text += f", while in {describe_call(rec)} seq {seq}"
    elif seq is not None:
        text += f"; it never called seq {seq} of {comm}"
    return text


def _reason(states: set, failed: bool = True) -> str | None:
    """The class of a verdict from its ranks' states; ``timeout`` when a rank failed otherwise
    (it waited for a peer past HCCL_EXEC_TIMEOUT), None while no rank has failed (a live view
    of a job that waits: no timeout has happened)."""
    for kind in CLASSES:
        if kind.value in states:
            return kind.value
    return Failure.TIMEOUT.value if failed else None


def _any_failed(infos: list[RankInfo]) -> bool:
    """Whether a rank failed: its process ended non-zero, or a collective of it failed."""
    return any(i.exit not in (None, 0) or any(r.get("state") == "failed" for r in records(i.state))
               for i in infos)


def classify(infos: list[RankInfo], *, now: float | None = None,
             cycle: list[dict] | None = None) -> dict:
    """The verdict as a JSON-able dict (see the module note); ``infos`` covers every rank.

    ``cycle`` (from ``find_cycle``) makes it a deadlock verdict: its ranks are the culprits.
    """
    now = time.time() if now is None else now
    if cycle:
        return _deadlock(infos, cycle, now)
    focus = _focus(infos)
    by_rank = {i.rank: i for i in infos}
    if focus is None:
        return _outside(infos, now)
    cid, seq, members = focus.get("comm_id"), focus.get("seq"), focus.get("members") or sorted(by_rank)
    recs = {}
    for info in infos:
        for r in records(info.state):
            if r.get("comm_id") == cid and r.get("seq") == seq:
                recs[info.rank] = r
    votes = collections.Counter(_fp(r) for r in recs.values())
    top = votes.most_common()
    majority = top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None
    if majority is None and len(votes) > 1:
        majority = _tie_break(recs, by_rank, members)
    ranks, culprits = {}, []
    caused = any(_dead(i) or _own_error(i) for i in infos)    # a rank failed by itself
    for g in members:
        info = by_rank.get(g, RankInfo(g))
        rec = recs.get(g)
        done = _progress(info.state, cid)
        age = state_age(info, now)
        if _dead(info):
            where, rec = _last_position(info, rec, seq, cid,
                                        [by_rank[m] for m in members if m != g and m in by_rank])
            ranks[str(g)] = _entry("dead", info, rec, f"{describe_exit(info.exit)}; {where}",
                                   members)
        elif _own_error(info):
            ranks[str(g)] = _entry("error", info, rec,
                                   _error_detail(info, seq, focus.get("comm"), rec), members)
        elif done[1] >= seq or (rec is not None and rec.get("state") == "completed"):
            ranks[str(g)] = _entry("completed", info, rec, f"completed seq {seq}", members)
        elif info.exit == 0 and (rec is not None or caused):
            # it ended cleanly: what it called completed (its published state may be up to an
            # interval older than its end); with a rank dead or failed by itself, that rank
            # stopped the job, not one that finished its work
            ranks[str(g)] = _entry("completed", info, None, "exited 0", members)
        elif rec is not None and majority is not None and _fp(rec) != majority:
            ranks[str(g)] = _entry("mismatch", info, rec, f"called {describe_call(rec)} at seq {seq}",
                                   members)
        elif rec is not None and majority is None and len(votes) > 1:
            ranks[str(g)] = _entry("mismatch", info, rec, f"called {describe_call(rec)} at seq {seq}",
                                   members)
        elif age is not None:
            ranks[str(g)] = _entry("unreachable", info, rec, _unreachable(info, age), members)
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
                     f"({info.error_line or describe_exit(info.exit)})" if released else
                     _elsewhere(info) or "alive, still in user code")
            ranks[str(g)] = _entry("not_entered", info, None,
                                   f"never called seq {seq} (last enqueued seq {done[0]}); {where}",
                                   members)
            if released:                  # a victim of the abort, not a cause of the hang
                continue
        if ranks[str(g)]["state"] in ("dead", "error", "mismatch", "not_entered", "unreachable"):
            culprits.append(g)
    if not culprits:
        waited = collections.Counter(e["waiting_for"] for e in ranks.values()
                                     if e["state"] == "waiting" and e["waiting_for"] is not None)
        if waited:
            n = max(waited.values())
            culprits = sorted(r for r, c in waited.items() if c == n)
    reason = _reason({e["state"] for e in ranks.values()}, _any_failed(infos))
    others = {}
    for i in infos:
        if i.rank in members:
            continue
        if _dead(i) or _own_error(i):   # a cause outside the communicator is still a cause
            dead = _dead(i)
            ranks[str(i.rank)] = _entry("dead" if dead else "error", i, None,
                                        describe_exit(i.exit) if dead else _error_detail(i))
            culprits.append(i.rank)
            reason = _reason({"dead" if dead else "error", reason})
            continue
        age = state_age(i, now)
        others[str(i.rank)] = {"state": _unreachable(i, age) if age else describe_exit(i.exit),
                               "exit": i.exit}
    return {"reason": reason, "comm": focus.get("comm"), "comm_id": cid, "members": members,
            "seq": seq, "op": describe_call(focus), "culprits": culprits, "ranks": ranks,
            "other_ranks": others, "holds_up": _holds_up(infos, culprits, cid),
            "verdict": _headline(culprits, ranks, seq, focus, _call_of(majority, recs)),
            "time": now}


HOLDS_UP = 3      # culprits whose other held-up collectives a verdict lists


def _holds_up(infos: list[RankInfo], culprits: list[int], focus_cid) -> dict:
    """{culprit: [{comm, seq, op, waiters}]}: the collectives of other communicators than the
    focus that wait for a culprit (its peers are in or failed in a seq it never started), for
    the first HOLDS_UP culprits. In a job of subgroups the focus may be one of several places
    the same rank holds up (its tensor-parallel group, its data-parallel group, the world's
    barrier): this names the others, the culprit's own groups among them."""
    want = set(culprits[:HOLDS_UP])
    if not want:
        return {}
    by_rank = {i.rank: i for i in infos}
    entered = set()                 # (rank, comm_id, seq) started, completed or failed
    calls: dict = {}                # (comm_id, seq) -> (record, waiters)
    for info in infos:
        for r in records(info.state):
            key = (r.get("comm_id"), r.get("seq"))
            if r.get("state") in ("started", "completed", "failed"):
                entered.add((info.rank,) + key)
            if key[0] != focus_cid and r.get("state") in ("started", "failed") and \
                    want & set(r.get("members") or ()):
                calls.setdefault(key, (r, []))[1].append(info.rank)
    out: dict = {}
    for (cid, seq), (r, waiters) in sorted(calls.items(), key=lambda kv: (
            kv[1][0].get("t_started") or 0, kv[0][1] or 0)):
        for c in sorted(want & set(r.get("members") or ())):
            info = by_rank.get(c) or RankInfo(c)
            if (c, cid, seq) in entered or _progress(info.state, cid)[1] >= (seq or 0):
                continue
            out.setdefault(str(c), []).append({"comm": r.get("comm"), "seq": seq,
                                               "op": describe_call(r), "waiters": sorted(waiters)})
    return out


def _last_position(info: RankInfo, rec: dict | None, seq, cid, others: list[RankInfo]
                   ) -> tuple[str, dict | None]:
    """Where a dead rank was, as far as its last published state tells without contradicting
    the others: (words, its record of the focus seq if it was in it, else None).

    Its state was published up to an interval before it died: a SIGKILLed rank writes nothing
    more. When the others got further than that state (they completed a seq it had not even
    enqueued, or finished and exited 0), the state is stale and its position unknown.
    """
    others_done = max((_progress(o.state, cid)[1] for o in others), default=0)
    finished = any(o.exit == 0 for o in others)
    if not info.state:
        return "its last seq is unknown (it published no state)", None
    enq, done = _progress(info.state, cid)
    if (rec is not None and rec.get("state") != "completed" and others_done < seq
            and not finished):
        return f"it was in {describe_call(rec)} seq {seq}", rec
    if others_done > enq or finished:
        theirs = (f"the others' progress (seq {others_done} completed)" if others_done > enq
                  else "the others, which finished and exited 0")
        return (f"its last seq is unknown: its last published state (seq {enq} enqueued, "
                f"{done} completed) is older than {theirs}"), None
    return f"its last published state: seq {enq} enqueued, seq {done} completed", None


def _elsewhere(info: RankInfo) -> str | None:
    """Where a live rank that has not called the focus waits instead, if in a collective or a
    receive: the stall's other end."""
    for r in (info.state or {}).get("in_flight") or ():
        if r.get("state") == "started":
            return (f"alive, inside {describe_call(r)} seq {r.get('seq')} of {r.get('comm')} "
                    f"at {r.get('site')}")
    return None


def _outside(infos: list[RankInfo], now: float) -> dict:
    """The verdict when no collective is in flight or failed: each rank's own end."""
    ranks, culprits = {}, []
    for i in infos:
        age = state_age(i, now)
        if _dead(i):
            state, detail = "dead", describe_exit(i.exit)
        elif _own_error(i):
            state, detail = "error", _error_detail(i)
        elif age is not None:
            state, detail = "unreachable", _unreachable(i, age)
        elif i.exit not in (None, 0):
            state, detail = "released", f"{describe_exit(i.exit)} ({i.error_line})"
        elif i.exit == 0:
            state, detail = "completed", "exited 0"
        else:
            state, detail = "running", "alive, in user code"
        ranks[str(i.rank)] = _entry(state, i, None, detail)
        if state in ("dead", "error", "unreachable"):
            culprits.append(i.rank)
    states = {ranks[str(r)]["state"] for r in culprits}
    reason = _reason(states) if culprits else None
    parts = [f"rank {r} {'is ' if ranks[str(r)]['state'] != 'error' else ''}"
             f"{ranks[str(r)]['detail']}" for r in culprits]
    return {"reason": reason, "comm": None, "seq": None, "op": None, "members": sorted(
        i.rank for i in infos), "culprits": culprits, "ranks": ranks, "other_ranks": {},
        "verdict": "; ".join(parts) + " (outside any collective)" if parts else
        "no collective is in flight and no rank failed", "time": now}


def _tie_break(recs: dict, by_rank: dict, members: list) -> tuple | None:
    """The majority call when the published records tie (ranks released before they called
    it left none): the calls that mismatch errors compared count too (typed error records)."""
    calls = {g: describe_call(r) for g, r in recs.items()}
    for g in members:
        err = (by_rank.get(g) or RankInfo(g)).error or {}
        for r, call in zip(err.get("ranks") or (), err.get("calls") or ()):
            if isinstance(r, int) and 0 <= r < len(members) and members[r] not in calls:
                calls[members[r]] = call
    top = collections.Counter(calls.values()).most_common()
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return None
    return next((_fp(r) for r in recs.values() if describe_call(r) == top[0][0]), None)


def _unreachable(info: RankInfo, age: float) -> str:
    st = info.state or {}
    where = f"node {st.get('node')}" if st.get("node") is not None else "its node"
    if st.get("host"):
        where += f" ({st['host']})"
    return (f"unreachable since {age:.0f} s: its published state stopped refreshing on {where}; "
            "its process is not known to be alive")


def _deadlock(infos: list[RankInfo], cycle: list[dict], now: float) -> dict:
    by_rank = {i.rank: i for i in infos}
    in_cycle = [e["rank"] for e in cycle]
    ranks = {}
    for e in cycle:
        info = by_rank.get(e["rank"], RankInfo(e["rank"]))
        entry = _entry("waiting", info, None, None)
        entry.update(seq=e["seq"], op=e["op"], waiting_for=e["waits_for"], since=e["since"],
                     site=e["site"], comm=e["comm"],
                     detail=f"in {e['op']} seq {e['seq']} of {e['comm']} at {e['site']}, waits "
                            f"for rank {e['waits_for']}")
        ranks[str(e["rank"])] = entry
    others = {str(i.rank): {"state": describe_exit(i.exit) if i.exit is not None else
                            "alive, outside the cycle", "exit": i.exit}
              for i in infos if i.rank not in in_cycle}
    story = "; ".join(f"rank {e['rank']} waits in {e['comm']} (seq {e['seq']}, {e['op']}) for "
                      f"rank {e['waits_for']}" for e in cycle)
    first = cycle[0]
    across = " across communicators" if len({e["comm_id"] for e in cycle}) > 1 else ""
    advice = ("post one side's send before its receive, or put them on two streams (a receive "
              "blocks the stream, and the send queued behind it never starts)"
              if any(e["op"].startswith("RECV") for e in cycle) else
              "make every rank call the collectives of shared communicators in the same order")
    return {"reason": Failure.DEADLOCK.value, "comm": first["comm"], "comm_id": first["comm_id"],
            "members": sorted(in_cycle), "seq": first["seq"], "op": first["op"],
            "culprits": sorted(in_cycle), "ranks": ranks, "other_ranks": others,
            "cycle": [{k: e[k] for k in ("rank", "comm", "seq", "op", "waits_for", "site")}
                      for e in cycle],
            "verdict": f"deadlock{across}: {story}; each waits for the other, no timeout can "
                       f"resolve it: {advice}",
            "time": now}


def _progress(st, cid) -> tuple[int, int]:
    for p in (st or {}).get("progress") or ():
        if p.get("comm_id") == cid:
            return int(p.get("last_enqueued") or 0), int(p.get("last_completed") or 0)
    return 0, 0


def _entry(state, info: RankInfo, rec, detail, members=None) -> dict:
    waiting_for = since = None
    if rec is not None and state == "waiting":
        w = rec.get("waiting_for")
        if w is not None and members and 0 <= w < len(members):
            waiting_for = members[w]
        since = rec.get("waiting_since") or rec.get("t_started")
    return {"state": state, "seq": rec.get("seq") if rec else None,
            "op": describe_call(rec) if rec else None, "waiting_for": waiting_for, "since": since,
            "site": rec.get("site") if rec else None, "exit": info.exit, "error": info.error_line,
            "detail": detail,
            # where the rank's code saw its own error; a release by another rank's abort says
            # nothing about this rank (its stack, taken before the abort, does)
            "traceback": info.traceback if info.kind is not Failure.RELEASED else None,
            "stack": name_threads(info.stack, (info.state or {}).get("threads"))}


def _call_of(fp, recs: dict) -> str | None:
    for r in recs.values():
        if _fp(r) == fp:
            return describe_call(r)
    return None


def _headline(culprits, ranks, seq, focus, majority_call) -> str:
    if not culprits:
        return f"every rank is waiting in {describe_call(focus)} seq {seq}; no culprit found"
    parts, split = [], []
    for c in culprits[:HEADLINE_CULPRITS]:
        e = ranks[str(c)]
        if e["state"] == "dead":
            parts.append(f"rank {c} is dead ({e['detail']})")
        elif e["state"] == "mismatch" and majority_call:
            parts.append(f"rank {c} {e['detail']}; the others called {majority_call}")
        elif e["state"] == "mismatch":
            parts.append(f"rank {c} {e['detail']}")
            split.append(c)
        elif e["state"] in ("not_entered", "error"):
            parts.append(f"rank {c} {e['detail']}")
        else:
            parts.append(f"rank {c} is waited for by the others")
    if len(culprits) > HEADLINE_CULPRITS:       # the report's table has every one
        more = sorted(culprits[HEADLINE_CULPRITS:])
        parts.append(f"and {len(more)} more culprits: ranks {short_ranks(more)}")
    if split:       # no majority: ranks released before they called seq have no vote
        parts.append(f"no majority among the calls made, so any of ranks {split} may be the odd "
                     "one (ranks that never called it have no vote)")
    victims = sorted(int(r) for r, e in ranks.items()
                     if int(r) not in culprits and e["state"] != "completed")
    if victims and any(ranks[str(c)]["state"] in ("error", "dead") for c in culprits):
        shown = victims if len(victims) <= HEADLINE_CULPRITS * 2 else short_ranks(victims)
        parts.append(f"rank(s) {shown} only waited for {'it' if len(culprits) == 1 else 'them'} "
                     "(victims, not causes)")
    return "; ".join(parts)


