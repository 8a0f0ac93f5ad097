"""What npurun knows of one rank (``RankInfo``) and how its published state is read.

A rank's state (``hccl.diag``) holds flight-recorder records: in flight, failed, recent. The
verdict (``verdict``) and the wait-for graph (``waitfor``) read them through ``records`` (the
collectives, each once) and word a record's call with ``describe_call``; a state that stopped
refreshing (``state_age``) marks a rank unreachable, never alive.
"""
from __future__ import annotations

from dataclasses import dataclass

from hccl import types
from hccl.failure import Failure, parse

STALE_MIN = 5.0       # a state older than this (and 10 publish intervals) has stopped refreshing


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

    @property
    def kind(self) -> Failure | None:
        """The kind of its error (the error file's typed record), if it raised."""
        return parse((self.error or {}).get("kind"))


def state_age(info: RankInfo, now: float) -> float | None:
    """Seconds since ``info``'s state stopped refreshing, if it did (None: fresh, ended, or a
    process npurun sees running: a busy rank may publish late, but it is there)."""
    st = info.state
    if info.exit is not None or info.alive or not st or not st.get("time"):
        return None
    age = now - float(st["time"])
    limit = max(STALE_MIN, 10 * float(st.get("interval") or 0.5))
    return age if age > limit else None


def records(st: dict | None) -> list[dict]:
    """The collective records of a published state (in flight, failed, recent), each once."""
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


def describe_call(rec: dict) -> str:
    """A flight record's call, as ``hccl.types.describe_call`` words every call."""
    return types.describe_call(rec.get("op"), rec.get("count"), rec.get("dtype"), rec.get("redop"),
                               rec.get("root"))
