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
import os
import time
from dataclasses import dataclass

from hccl import types
from launcher.errors import describe_exit

STATES = ("completed", "waiting", "not_entered", "dead", "mismatch", "unreachable")
# error-file kinds (launcher.worker.error_record) of a collective error: the rank did not die
HCCL_KINDS = ("timeout", "mismatch", "released", "hccl")
STALE_MIN = 5.0       # a state older than this (and 10 publish intervals) has stopped refreshing
_STACK_LINES = 24


@dataclass
class RankInfo:
    rank: int
    state: dict | None = None        # published state (hccl.diag), None if none was seen
    exit: int | None = None          # None while alive (or unknown: another node)
    error: dict | None = None        # the error file's typed record (kind, type, rank, text)
    stack: str | None = None         # Python stacks taken on request
    traceback: str | None = None     # the traceback of its error file, if it raised
    alive: bool | None = None        # True: npurun sees its process running (a local rank)

    @property
    def error_line(self) -> str | None:
        """``Type: text`` of its error, for a report line."""
        e = self.error
        return f"{e.get('type')}: {e.get('text')}" if e else None


def state_age(info: RankInfo, now: float) -> float | None:
    """Seconds since ``info``'s state stopped refreshing, if it did (None: fresh, ended, or a
    process npurun sees running: a busy rank may publish late, but it is there)."""
    st = info.state
    if info.exit is not None or info.alive or not st or not st.get("time"):
        return None
    age = now - float(st["time"])
    limit = max(STALE_MIN, 10 * float(st.get("interval") or 0.5))
    return age if age > limit else None


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
    return rec.get("error_type") == "RemoteRankError"


def _fp(rec: dict) -> tuple:
    return (rec.get("op"), rec.get("count"), rec.get("dtype"), rec.get("redop"), rec.get("root"))


def describe_call(rec: dict) -> str:
    """A flight record's call, as ``hccl.types.describe_call`` words every call."""
    return types.describe_call(rec.get("op"), rec.get("count"), rec.get("dtype"), rec.get("redop"),
                               rec.get("root"))


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
    """Whether the rank's end is a cause: it exited non-zero or by a signal without an hccl
    error first. One that recorded an hccl error and then died by a signal (npurun stopping it,
    or torch aborting the interpreter's teardown, as it does now and then after an exception)
    had already failed for that error."""
    if info.exit is None or info.exit == 0:
        return False
    return (info.error or {}).get("kind") not in HCCL_KINDS


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
        ranks, culprits = {}, []
        for i in infos:
            age = state_age(i, now)
            state = "dead" if _dead(i) else "unreachable" if age is not None else "completed"
            ranks[str(i.rank)] = _entry(state, i, None, _unreachable(i, age) if age else None)
            if state != "completed":
                culprits.append(i.rank)
        dead = [r for r in culprits if ranks[str(r)]["state"] == "dead"]
        return {"reason": "dead_rank" if dead else "no_collective", "comm": None, "seq": None,
                "op": None, "members": sorted(by_rank), "culprits": culprits, "ranks": ranks,
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
    if majority is None and len(votes) > 1:
        majority = _tie_break(recs, by_rank, members)
    ranks, culprits = {}, []
    for g in members:
        info = by_rank.get(g, RankInfo(g))
        rec = recs.get(g)
        done = _progress(info.state, cid)
        age = state_age(info, now)
        if _dead(info):
            detail = describe_exit(info.exit)
            if info.error:
                detail += f" ({info.error_line})"
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
                     "alive, still in user code")
            ranks[str(g)] = _entry("not_entered", info, None,
                                   f"never called seq {seq} (last enqueued seq {done[0]}); {where}",
                                   members)
            if released:                  # a victim of the abort, not a cause of the hang
                continue
        if ranks[str(g)]["state"] in ("dead", "mismatch", "not_entered", "unreachable"):
            culprits.append(g)
    if not culprits:
        waited = collections.Counter(e["waiting_for"] for e in ranks.values()
                                     if e["state"] == "waiting" and e["waiting_for"] is not None)
        if waited:
            n = max(waited.values())
            culprits = sorted(r for r, c in waited.items() if c == n)
    states = {e["state"] for e in ranks.values()}
    reason = ("dead_rank" if "dead" in states else "mismatch" if "mismatch" in states else "timeout")
    others = {}
    for i in infos:
        if i.rank not in members:
            age = state_age(i, now)
            others[str(i.rank)] = {"state": "dead" if _dead(i) else _unreachable(i, age) if age
                                   else describe_exit(i.exit), "exit": i.exit}
    return {"reason": reason, "comm": focus.get("comm"), "comm_id": cid, "members": members,
            "seq": seq, "op": describe_call(focus), "culprits": culprits, "ranks": ranks,
            "other_ranks": others,
            "verdict": _headline(culprits, ranks, seq, focus, _call_of(majority, recs)),
            "time": now}


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


# -- the wait-for graph ------------------------------------------------------------------------
def wait_edges(infos: list[RankInfo]) -> list[dict]:
    """The wait-for graph: one edge per (waiting rank, rank it waits for).

    A rank inside a collective (comm X, seq s) waits for every member that has not started
    seq s of X (never called it, or it sits on a blocked stream). Waits between members that are
    all inside the same collective are no edges: that collective progresses or times out (a
    ring of neighbours waiting for each other is how a large collective works, not a deadlock).
    Edges carry comm, seq and op, so a cycle reads as a story.
    """
    started = {}                    # (rank, comm_id, seq) of every started collective
    for info in infos:
        for r in _records(info.state):
            if r.get("state") == "started":
                started[(info.rank, r.get("comm_id"), r.get("seq"))] = r
    edges = []
    for (rank, cid, seq), r in started.items():
        members = r.get("members") or []
        blockers = [m for m in members if m != rank and (m, cid, seq) not in started
                    and not _completed(infos, m, cid, seq)]
        for b in blockers:
            edges.append({"rank": rank, "waits_for": b, "comm": r.get("comm"), "comm_id": cid,
                          "seq": seq, "op": describe_call(r), "site": r.get("site"),
                          "since": r.get("waiting_since") or r.get("t_started")})
    return edges


def _completed(infos, rank, cid, seq) -> bool:
    for info in infos:
        if info.rank == rank:
            return _progress(info.state, cid)[1] >= seq
    return False


def find_cycle(infos: list[RankInfo]) -> list[dict] | None:
    """The edges of one cycle of the wait-for graph (smallest rank first), or None."""
    edges = wait_edges(infos)
    out = collections.defaultdict(list)
    for e in edges:
        out[e["rank"]].append(e)
    best = None
    for start in sorted(out):
        # depth-first search from ``start`` for a path back to it (graphs here are small)
        stack = [(start, [])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for e in out.get(node, ()):
                if e["waits_for"] == start:
                    cyc = path + [e]
                    if best is None or len(cyc) < len(best):
                        best = cyc
                elif e["waits_for"] not in seen and e["waits_for"] > start:
                    seen.add(e["waits_for"])
                    stack.append((e["waits_for"], path + [e]))
    return best


def cycle_key(cycle: list[dict] | None) -> tuple | None:
    """What must stay the same between polls for a cycle to count as stable."""
    if not cycle:
        return None
    return tuple(sorted((e["rank"], e["waits_for"], e["comm_id"], e["seq"]) for e in cycle))


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
    return {"reason": "deadlock", "comm": first["comm"], "comm_id": first["comm_id"],
            "members": sorted(in_cycle), "seq": first["seq"], "op": first["op"],
            "culprits": sorted(in_cycle), "ranks": ranks, "other_ranks": others,
            "cycle": [{k: e[k] for k in ("rank", "comm", "seq", "op", "waits_for", "site")}
                      for e in cycle],
            "verdict": f"deadlock across communicators: {story}; each waits for the other, "
                       "no timeout can resolve it: make every rank call the collectives of "
                       "shared communicators in the same order",
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
            "site": rec.get("site") if rec else None, "exit": info.exit, "error": info.error_line,
            "detail": detail,
            # where the rank's code saw its own error; a release by another rank's abort says
            # nothing about this rank (its stack, taken before the abort, does)
            "traceback": info.traceback if (info.error or {}).get("kind") != "released" else None,
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
    for c in culprits:
        e = ranks[str(c)]
        if e["state"] == "dead":
            parts.append(f"rank {c} is dead ({e['detail']})")
        elif e["state"] == "mismatch" and majority_call:
            parts.append(f"rank {c} {e['detail']}; the others called {majority_call}")
        elif e["state"] == "mismatch":
            parts.append(f"rank {c} {e['detail']}")
            split.append(c)
        elif e["state"] == "not_entered":
            parts.append(f"rank {c} {e['detail']}")
        else:
            parts.append(f"rank {c} is waited for by the others")
    if split:       # no majority: ranks released before they called seq have no vote
        parts.append(f"no majority among the calls made, so any of ranks {split} may be the odd "
                     "one (ranks that never called it have no vote)")
    return "; ".join(parts)


_INTERNAL_THREADS = ("hccl/diag.py", "hccl/transport/zmq.py", "hccl/store.py")
_BOOTSTRAP = ("launcher/worker.py", "<frozen runpy>")
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN = tuple(f'File "{os.path.join(_PKG, p)}{os.sep}' for p in ("runtime", "hccl", "launcher")) \
    + ("threading.py\"",)


def _own_frame(line: str) -> bool:
    """A frame of npusim itself or of the threading module (the user did not write it)."""
    return line.strip().startswith("File ") and any(t in line for t in _OWN)


def _collapse(block: str) -> list[str]:
    """A thread's frames with runs of npusim's own frames folded into one line."""
    out, run = [], 0
    for line in block.splitlines():
        if any(t in line for t in _BOOTSTRAP):
            continue
        if _own_frame(line):
            run += 1
            continue
        if run:
            out.append(f"  ... {run} frame(s) of npusim")
            run = 0
        out.append(line)
    if run:
        out.append(f"  ... {run} frame(s) of npusim")
    return out


def _busy(block: str) -> bool:
    """A thread worth showing: it runs user code, or a stream task (not an idle stream worker)."""
    frames = [l for l in block.splitlines() if l.strip().startswith("File ")]
    return any(not _own_frame(l) and not any(t in l for t in _BOOTSTRAP) for l in frames) or \
        any("runtime/stream.py" in l and l.rstrip().endswith(" in _run") for l in frames)


def user_threads_first(stack: str) -> str:
    """faulthandler's dump for a reader: the main thread first, the other threads only when busy
    (npusim's daemon threads and idle stream workers say nothing about the hang), npusim's own
    frames folded (the full dump is in hang_report.json)."""
    blocks = [b for b in stack.strip().split("\n\n") if b.strip()]
    main = [b for b in blocks if b.lstrip().startswith("Current thread")]
    rest = [b for b in blocks if b not in main and not any(t in b for t in _INTERNAL_THREADS)
            and _busy(b)]
    return "\n\n".join("\n".join(_collapse(b)) for b in main + rest)


def last_traceback(tb: str | None) -> str | None:
    """The outermost exception of a chained traceback (where the user's code saw it), with
    npusim's own frames folded."""
    if not tb:
        return None
    part = tb.strip().split("Traceback (most recent call last):")[-1]
    out, run, skipping = ["Traceback (most recent call last):"], 0, False
    for line in part.splitlines():
        if not line.strip() or set(line.strip()) <= set("^~"):
            continue
        if line.startswith("  File "):
            skipping = _own_frame(line) or any(t in line for t in _BOOTSTRAP)
            if skipping:
                run += 1
                continue
        elif skipping and line.startswith("    "):
            continue                    # the source line of a skipped frame
        else:
            skipping = False
        if run:
            out.append(f"  ... {run} frame(s) of npusim")
            run = 0
        out.append(line)
    return "\n".join(out)


def format_report(v: dict, *, now: float | None = None, stacks: bool = True) -> str:
    """The one report npurun prints: culprits first, then the table, then the culprits' stacks."""
    now = time.time() if now is None else now
    bar = "=" * 78
    lines = [bar, "npusim job verdict" + (f": {v['reason']}" if v.get("reason") else ""), bar]
    if v.get("cycle"):
        lines.append("wait-for cycle: " + " -> ".join(
            [f"rank {e['rank']} ({e['comm']} seq {e['seq']})" for e in v["cycle"]]
            + [f"rank {v['cycle'][0]['rank']}"]))
    elif v.get("comm") is not None:
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
        if e.get("detail") and (e["state"] != "waiting" or v.get("cycle")):
            lines.append(f"{'':>7}{e['detail']}")
    for r, e in sorted((v.get("other_ranks") or {}).items(), key=lambda kv: int(kv[0])):
        where = f"not a member of {v['comm']}" if not v.get("cycle") else "not in the cycle"
        lines.append(f"{r:>5}  ({where}: {e['state']})")
    if stacks:
        for c in v["culprits"]:
            e = v["ranks"].get(str(c)) or {}
            # a rank that raised shows where its code saw the error; a stack taken while it
            # was exiting shows nothing of it
            st, what = e.get("stack"), "Python stacks"
            if e.get("traceback"):
                st, what = last_traceback(e["traceback"]), "traceback"
            elif st:
                st = user_threads_first(st)
            if st:
                body = st.strip().splitlines()
                more = len(body) - _STACK_LINES
                lines.append(f"----- {what} of culprit rank {c} -----")
                lines.extend(body[:_STACK_LINES])
                if more > 0:
                    lines.append(f"... ({more} more lines in hang_report.json)")
    lines.append(bar)
    return "\n".join(lines)
