"""Every per-call cache of hccl, in one place: bounded, immutable values, one ``clear()``.

Design note.

A collective call repeats work that depends only on its shape (op, rank, size, count, dtype,
reduce op, root, peer, in place, algorithm, slice bytes, the transport's solo bytes): building
the schedule, the bytes each buffer needs, the wire fingerprint, the flight recorder's names.
Each message repeats work that depends only on its secret (the keyed HMAC) or its fingerprint
(normalizing it to 5 ints). At 64 KiB and below that work costs as much as the copy, so it is
done once and looked up.

The plans are a ``functools.lru_cache`` of 512 shapes (its hit path is C: a Python-level lookup
measured 0.2-0.3 us more per call); the fingerprints a ``Memo``: a dict bounded by a size,
emptied whole when full (a job uses a handful of fingerprints; one that churns them pays one
rebuild per bound, never unbounded memory). Values are immutable (frozen dataclasses, tuples,
read-only mappings), so sharing one between threads and calls needs no lock and a caller cannot
corrupt the next call's plan.

Where the other caches live, and why not here:
- the keyed HMAC per job secret: ``hccl.wire.MACS`` (only ever ``copy()``'d), beside the wire
  format, so that ``import hccl.store`` stays free of numpy and the runtime; ``sizes()`` and
  ``clear()`` cover it;
- a communicator's validated calls: ``hccl.call.Calls``, one per communicator (``BOUND``
  calls), since a call holds that communicator's buffers' views and pairs; ``comm.destroy()``
  empties it;
- a task graph's captured calls and fused groups: the graph's nodes (``hccl.algo.fusion``), freed
  with the graph.
``clear()`` empties this module's caches and the MACs (tests; a process that wants its memory
back).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from hccl import wire
from hccl.algo import schedule
from hccl.flight import recorder
from hccl.types import DataType, Fingerprint, OpType

_MEMOS: list["Memo"] = []


class Memo:
    """A dict of at most ``bound`` entries; ``get`` is the dict's own (lookups at C speed)."""

    __slots__ = ("name", "bound", "_d", "get")

    def __init__(self, name: str, bound: int):
        if bound < 1:
            raise ValueError(f"Memo {name!r}: bound={bound} must be at least 1")
        self.name, self.bound = name, bound
        self._d: dict = {}
        self.get = self._d.get
        _MEMOS.append(self)

    def put(self, key, value):
        """Store ``value`` under ``key`` (emptying the memo first when full); returns ``value``."""
        d = self._d
        if len(d) >= self.bound:
            d.clear()
        d[key] = value
        return value

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()


FINGERPRINTS = Memo("fingerprints", 4096)   # any fingerprint -> its tuple of 5 Python ints


def clear() -> None:
    """Empty every cache of this module, and the keyed MACs (``hccl.wire.MACS``)."""
    collective.cache_clear()
    for m in _MEMOS:
        m.clear()
    wire.MACS.clear()


def sizes() -> dict[str, int]:
    """Entries held per cache, by name (for tests and diagnostics)."""
    return {"plans": collective.cache_info().currsize, "macs": len(wire.MACS),
            **{m.name: len(m) for m in _MEMOS}}


@dataclass(frozen=True)
class Plan:
    """What one call shape needs, computed once: the schedule, the bytes of ``send`` and
    ``recv`` it touches, the wire fingerprint (Send and Recv share one, so that a send matches
    its recv), the recorder's fingerprint and the recorder's names for it."""

    steps: schedule.Schedule
    nbytes: Mapping[str, int]
    fp: Fingerprint
    rec_fp: Fingerprint
    names: tuple


@functools.lru_cache(maxsize=512)
def collective(op: OpType, rank: int, size: int, count: int, dtype: DataType, redop, root, peer,
               inplace: bool, algo: str, slice_bytes: int, solo_bytes: int = 0) -> Plan:
    """The Plan of a call of this shape (built on first use); raises what ``schedule.build``
    raises for bad arguments (nothing is cached then)."""
    steps = schedule.build(op, rank, size, count, dtype.itemsize, slice_bytes, root=root,
                           peer=peer, inplace=inplace, algo=algo, solo_bytes=solo_bytes)
    nbytes = {name: steps.extents.get(name, 0) for name in ("send", "recv")}
    if inplace:
        nbytes["send"] = nbytes["recv"] = max(nbytes.values())
    rec_fp = Fingerprint.make(op, count, dtype, redop, root)
    fp = Fingerprint.make(OpType.SEND, count, dtype, redop, root) \
        if op in (OpType.SEND, OpType.RECV) else rec_fp
    return Plan(steps, MappingProxyType(nbytes), fp, rec_fp, recorder.names(rec_fp))
