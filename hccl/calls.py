"""Validated calls: an eager collective that repeats a call already checked skips the checks.

Design note. A training step issues the same collectives on the same buffers at every
iteration. Checking the arguments, looking up the plan and building the task's views cost an
eager 1 KiB AllReduce about a third of its time at world 2 (~15 of ~46 us, measured with the
checks skipped). A task graph skips them by construction (checked once, at capture); so does an
eager call that repeats one checked before:

- ``Call`` is what ``hccl.comm.enqueue`` derives from a call's arguments once they are valid:
  the stream, the plan, the message tag, the host views of the buffers and the marks of the
  allocations they lie in. ``hccl.comm.issue`` does the per-call rest, hit or miss alike: the
  stream check's declaration, the sequence number, the flight record, the profiler's arguments
  and the task.
- Each communicator keeps the Calls of its last ``BOUND`` distinct calls (a ``Memo``), keyed
  by collective, each buffer (a DevicePtr by value, any other buffer by identity), count, data
  type, reduce op and root as passed (each with its type) and the stream.
  ``hccl.comm.collective`` takes one only if the communicator is not destroyed, the stream
  resolves to the same live stream, every buffer object is the very one checked (a weak
  reference: the memo never keeps a user's array alive) and every buffer still lies in the
  same live allocation (``runtime.memory.same_allocations``: a free, a new allocation at the
  same address or a device reset changes it). Nothing else the checks read can change: an
  array's shape and dtype are fixed, a plan depends on the call's shape and on the
  communicator's knobs, fixed at its first call. A miss runs every check, as before, and
  remembers the new Call.
- The task looks again when it runs (a buffer may be freed after the call): if anything changed
  it rebuilds the views through ``runtime.host_view``, which raises the use-after-free error.
"""
from __future__ import annotations

import weakref

import runtime
from runtime.memory import DevicePtr, allocation_marks, same_allocations

BOUND = 64          # Calls kept per communicator (a step issues a handful; emptied when full)


class Call:
    """One validated call (see the module note); immutable once made."""

    __slots__ = ("comm", "op", "stream", "plan", "bufs", "views", "marks", "refs", "inplace",
                 "cid", "count", "dtype", "redop", "root", "peer", "knobs", "name",
                 "__weakref__")

    def __init__(self, comm, op, stream, plan, bufs: dict, inplace: bool, cid: int, count: int,
                 dtype, redop, root, peer, knobs: tuple, name: str):
        self.comm, self.op, self.stream, self.plan = comm, op, stream, plan
        self.inplace, self.cid, self.count, self.dtype = inplace, cid, count, dtype
        self.redop, self.root, self.peer, self.knobs, self.name = redop, root, peer, knobs, name
        self.bufs = tuple(k for k, b in bufs.items() if b is not None)
        objs = [bufs[k] for k in self.bufs]
        self.marks = allocation_marks(objs)
        self.refs = tuple(None if type(b) is DevicePtr else weakref.ref(b) for b in objs)
        self.views = self.host_views(bufs)

    def host_views(self, bufs: dict) -> dict:
        """The task's views of ``bufs`` (raises MemoryAccessError naming a freed buffer)."""
        nbytes = self.plan.nbytes
        views = {k: runtime.host_view(bufs[k], nbytes[k], name=k) for k in self.bufs
                 if not (self.inplace and k == "recv")}
        if self.inplace:
            views["recv"] = views["send"]
        return views

    def current_views(self, bufs: dict) -> dict:
        """``views`` while every buffer lies in the allocation it lay in at the check, else new
        ones (or the use-after-free error)."""
        if same_allocations(self.marks, [bufs[k] for k in self.bufs]):
            return self.views
        return self.host_views(bufs)


class Memo:
    """A communicator's Calls by key (see the module note); at most ``BOUND``."""

    __slots__ = ("_d",)

    def __init__(self):
        self._d: dict = {}

    def __len__(self) -> int:
        return len(self._d)

    def put(self, key, call: Call) -> None:
        d = self._d
        if len(d) >= BOUND:
            d.clear()
        try:
            d[key] = call
        except TypeError:       # an unhashable argument: the call is checked every time
            pass

    def clear(self) -> None:
        self._d.clear()

    def find(self, key, bufs: dict, stream) -> Call | None:
        """The Call remembered under ``key`` if it still holds for ``bufs`` on ``stream`` (the
        resolved stream), else None."""
        try:
            call = self._d.get(key)
        except TypeError:       # an unhashable argument: the checks say what is wrong with it
            return None
        if call is None or call.stream is not stream:
            return None
        objs = [bufs[k] for k in call.bufs]
        for ref, b in zip(call.refs, objs):
            if ref is not None and ref() is not b:
                return None
        if not same_allocations(call.marks, objs):
            return None
        return call


def key(op, bufs: dict, count, dtype, redop, root, stream) -> tuple:
    """The memo key of a call: its arguments as passed, each scalar with its type (1.0 equals 1
    and True equals 1, but the checks refuse them as counts and ranks). It may be unhashable:
    see ``Memo``."""
    return (op, tuple(b if type(b) is DevicePtr else id(b) for b in bufs.values()),
            type(count), count, type(dtype), dtype, type(redop), redop, type(root), root,
            id(stream))
