"""The wait-for graph of a job and its cycles: a deadlock, which no timeout resolves.

A rank inside a collective waits for the members that have not started it; a rank inside a
receive waits for its peer's send (``wait_edges``). A cycle of such waits (``find_cycle``), the
same over a few polls (``cycle_key``), is a deadlock: ``verdict.classify(infos, cycle=...)``
names its ranks as the culprits.
"""
from __future__ import annotations

import collections

from launcher.diagnosis.rankinfo import RankInfo, describe_call, records


def wait_edges(infos: list[RankInfo]) -> list[dict]:
    """The wait-for graph: one edge per (waiting rank, rank it waits for).

    A rank inside a collective (comm X, seq s) waits for every member that has not started
    seq s of X (never called it, or it sits on a blocked stream). Waits between members that are
    all inside the same collective are no edges: that collective progresses or times out (a
    ring of neighbours waiting for each other is how a large collective works, not a deadlock).
    A rank inside a receive (seq k from peer p) waits for p unless p has started (or done) its
    send number k to it: a send enqueued behind a blocked stream does not count. Edges carry
    comm, seq and op, so a cycle reads as a story.
    """
    started = {}                    # (rank, comm_id, seq) of every started collective
    for info in infos:
        for r in records(info.state):
            if r.get("state") == "started":
                started[(info.rank, r.get("comm_id"), r.get("seq"))] = r
    done = {(i.rank, p.get("comm_id")): int(p.get("last_completed") or 0)
            for i in infos for p in (i.state or {}).get("progress") or ()}
    edges = []
    for (rank, cid, seq), r in started.items():
        members = r.get("members") or []
        blockers = [m for m in members if m != rank and (m, cid, seq) not in started
                    and done.get((m, cid), 0) < seq]
        for b in blockers:
            edges.append(_edge(rank, b, r))
    return edges + _p2p_edges(infos)


def _edge(rank: int, blocker: int, r: dict) -> dict:
    return {"rank": rank, "waits_for": blocker, "comm": r.get("comm"), "comm_id": r.get("comm_id"),
            "seq": r.get("seq"), "op": describe_call(r), "site": r.get("site"),
            "since": r.get("waiting_since") or r.get("t_started")}


def _p2p_edges(infos: list[RankInfo]) -> list[dict]:
    sent, recvs = set(), []     # sends started or done: (sender, comm_id, to, seq)
    for info in infos:
        for r in _p2p(info.state):
            members = r.get("members") or []
            if not isinstance(r.get("peer"), int) or not 0 <= r["peer"] < len(members):
                continue
            peer = members[r["peer"]]
            if r.get("op") == "SEND" and r.get("state") in ("started", "completed"):
                sent.add((info.rank, r.get("comm_id"), peer, r.get("seq")))
            elif r.get("op") == "RECV" and r.get("state") == "started":
                recvs.append((info.rank, peer, r))
    return [_edge(rank, peer, r) for rank, peer, r in recvs
            if (peer, r.get("comm_id"), rank, r.get("seq")) not in sent]


def _p2p(st: dict | None) -> list[dict]:
    """The point-to-point records of a published state (each direction and peer has its seq)."""
    if not st:
        return []
    out, seen = [], set()
    for key in ("in_flight", "recent"):
        for r in st.get(key) or ():
            k = (r.get("comm_id"), r.get("op"), r.get("seq"), r.get("peer"))
            if r.get("peer") is not None and k not in seen:
                seen.add(k)
                out.append(r)
    return out


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
