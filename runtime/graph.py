"""Task graphs: capture the work of a step once, replay it with one launch (CUDA graphs,
torch.npu.NPUGraph, CANN's aclmdlRICaptureBegin / End / ExecuteAsync).

Design note. ``with runtime.graph(g, stream=s):`` puts ``s`` in capture mode: what would be
enqueued on it (kernels, copies, memsets, callbacks, event records and waits, collectives) is
appended to ``g`` as a node instead of running. Another stream joins the capture by waiting on
an event recorded inside it (fork) and must be waited on again by ``s`` before the capture ends
(join), as CUDA requires; the nodes keep the order the host issued them in, which is a valid
order of the graph's dependencies, so a replay runs them one after the other in ONE task on the
replay stream: one enqueue, one wake-up, no per-node queueing (branches of a fork lose their
overlap; a graph is for many small tasks, where the launch is the cost).

A node is either a function (run as captured, on the captured buffers: addresses are fixed, as
in CUDA graphs) or a *deferred* task (``Stream.enqueue_deferred``): a ``make()`` that builds
the function at every replay. hccl's collectives are deferred: they are validated and planned
once, at capture, and each replay takes the communicator's next sequence number and a new
flight-recorder entry, so a rank that replays another graph, or interleaves eager collectives
differently, is a mismatch reported as for eager code.

Fusion. A deferred node may carry a ``Fusable``: when the capture ends, a run of adjacent nodes
of one stream with equal keys, each accepted by ``fits``, becomes one node whose ``make`` is
``combine`` of their items. hccl uses it to run adjacent small AllReduces of a communicator as
one exchange (what NCCL's group calls and torch's coalesced collectives do): at 1 KiB the
exchange, not the bytes, is the cost. Only adjacent nodes fuse, so nothing is reordered; the
owner of the key decides what may fuse (hccl: disjoint buffers, an algorithm that reduces in
rank order at either size, so the results are bitwise those of the separate calls).

What cannot be captured raises ``GraphCaptureError`` at the call, in the capturing thread, and
leaves the capture going: a synchronize (stream, event, device), a host-synchronous copy or
memset, malloc and free, a wait on work outside the capture, and a collective on a stream that
did not join. An exception that leaves the ``with`` block ends the capture: the graph stays
empty and every stream of it is usable again.

Graph capture observes the core: while a capture runs anywhere in the process, this module is
``runtime.hooks.capture``, and the core asks it ``refuse(what)`` before what cannot be captured.
The core never imports it.
"""
from __future__ import annotations

import sys
import threading
from itertools import count
from typing import Callable, Hashable, NamedTuple

from . import hooks
from .callsite import callsite
from .current import resolve_stream
from .errors import GraphCaptureError, InvalidParamError

_tls = threading.local()        # .capture: the Capture the calling thread runs, if any
active = 0                      # captures running in the process: eager calls test this first
_active_lock = threading.Lock()  # active and hooks.capture change together
_ids = count(1)


def capturing():
    """The capture the calling thread is running, or None (a thread-local read)."""
    return getattr(_tls, "capture", None) if active else None


def refuse(what: str) -> None:
    """Raise GraphCaptureError if the calling thread is capturing: ``what`` cannot be captured."""
    if active and getattr(_tls, "capture", None) is not None:
        cap = _tls.capture
        raise GraphCaptureError(
            f"{what} cannot be captured: {cap.origin.name} is capturing graph {cap.graph.name} "
            "in this thread. Move it before the `with runtime.graph(...)` block or after it "
            "(allocate buffers before capturing; synchronize after the replay).")


def _count(delta: int) -> None:
    """Count a capture in or out; the first one in attaches this module to ``hooks.capture``,
    the last one out detaches it."""
    global active
    with _active_lock:
        active += delta
        hooks.capture = sys.modules[__name__] if active else None


class Fusable(NamedTuple):
    """How a deferred node may fuse with its neighbours (see the design note)."""

    key: Hashable                       # only nodes with equal keys fuse
    item: object                        # this node's part, given to fits and combine
    fits: Callable[[list, object], bool]    # may item join the run of items?
    combine: Callable[[list], Callable]     # items -> the fused node's make()


class _Node:
    __slots__ = ("fn", "make", "name", "category", "meta", "site", "stream", "fuse")

    def __init__(self, fn, make, name, category, meta, site, stream, fuse=None):
        self.fn, self.make, self.name, self.category = fn, make, name, category
        self.meta, self.site, self.stream, self.fuse = meta, site, stream, fuse


def _fused(nodes: list) -> list:
    """``nodes`` with every run of adjacent fusable nodes (one stream, equal keys, accepted by
    ``fits``) replaced by one node."""
    out, run = [], []

    def flush():
        if len(run) == 1:
            out.append(run[0])
        elif run:
            first, f = run[0], run[0].fuse
            meta = dict(first.meta or {}, fused=len(run))
            out.append(_Node(None, f.combine([n.fuse.item for n in run]),
                             f"{first.name} x{len(run)} (fused)", first.category, meta,
                             first.site, first.stream))
        run.clear()

    for n in nodes:
        f = n.fuse
        if run and (f is None or n.stream is not run[0].stream or f.key != run[0].fuse.key
                    or not f.fits([m.fuse.item for m in run], f.item)):
            flush()
        (run if f is not None else out).append(n)
    flush()
    return out


class Graph:
    """A captured sequence of tasks (``runtime.graph(g, stream=s)``), replayed by ``replay``."""

    def __init__(self, name: str | None = None, fuse: bool = True):
        self.name = name or f"graph{next(_ids)}"
        self.fuse = bool(fuse)          # fuse adjacent fusable nodes when the capture ends
        self._nodes: list[_Node] = []
        self._events: list = []         # events recorded inside: pointed at each replay
        self._accesses: list = []       # (task, site, reads, writes) the stream check noted
        self._captured = False
        self._collective = False        # holds deferred nodes (collectives)

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def captured(self) -> bool:
        """True once a capture into this graph completed."""
        return self._captured

    def replay(self, stream=None) -> int:
        """Enqueue the whole graph on ``stream`` (the current stream when None) as one task;
        returns its timeline value. Deferred nodes (collectives) build their work now, in order,
        on the calling thread: they take their communicators' next sequence numbers here.

        Raises GraphCaptureError before a capture completed, or while this thread captures.
        """
        if not self._captured:
            raise GraphCaptureError(f"{self.name} has not been captured: capture it with "
                                    "`with runtime.graph(g, stream=s):` first")
        refuse(f"{self.name}.replay()")
        s = resolve_stream(stream)
        nodes = self._nodes
        fns = [n.fn if n.make is None else n.make() for n in nodes] if self._collective \
            else [n.fn for n in nodes]

        def unit():
            prof = hooks.profiler
            for node, fn in zip(nodes, fns):
                t0 = prof.now_us() if prof is not None else 0.0
                try:
                    fn()
                except BaseException as exc:
                    exc.add_note(f"in node '{node.name}' of {self.name}, captured at {node.site}")
                    raise
                if prof is not None:
                    prof.record(s.id, node.name, node.category, t0, prof.now_us(), node.meta,
                                node.site)

        site = callsite(2)
        chk = hooks.stream_check
        if chk is not None and self._accesses:
            chk.replay(s, self._accesses, site)
        # lazily: a worker that patrols is not rung, the host's synchronize usually runs the
        # replay itself (``Stream.enqueue_lazy``)
        value = s.enqueue_lazy(unit, f"{self.name} replay ({len(nodes)} tasks)", "graph",
                               {"tasks": len(nodes)}, site)
        for ev in self._events:
            ev.replayed(s, value)
            if chk is not None:
                chk.event_recorded(ev, s, value)
        return value


class Capture:
    """One running capture: the graph, its origin stream and the streams that joined it."""

    def __init__(self, graph: Graph, origin):
        self.graph, self.origin = graph, origin
        self.lanes = {origin: -1}       # stream -> index of its last node (-1: none yet)
        self.joined: dict = {}          # stream -> index of its last node the origin waited for
        self.lock = threading.Lock()

    def add(self, stream, fn, make, name, category, meta, site, fuse=None) -> int:
        with self.lock:
            nodes = self.graph._nodes
            nodes.append(_Node(fn, make, name, category, meta, site, stream, fuse))
            self.lanes[stream] = len(nodes) - 1
            if make is not None:
                self.graph._collective = True
            return len(nodes)

    def note_access(self, task, site, reads, writes) -> None:
        """What the node about to be added reads and writes, for the stream check to check
        at every replay (``runtime.sanitizer.replay``)."""
        with self.lock:
            self.graph._accesses.append((task, site, tuple(reads), tuple(writes)))

    def record(self, event, stream, stamp=None) -> None:
        """An event recorded inside the capture: it marks ``stream``'s last node (``stamp``, a
        timing event's clock reading, becomes a node of its own)."""
        if stamp is not None:
            self.add(stream, stamp, None, "event_record", "event", None, callsite(3))
        with self.lock:
            event.captured_by = (self, stream, self.lanes[stream])
            if event not in self.graph._events:
                self.graph._events.append(event)

    def wait(self, stream, event) -> None:
        """``stream`` waits on ``event``: a fork (stream joins) or a join (into the origin)."""
        mark = event.captured_by
        if mark is None or mark[0] is not self:
            raise GraphCaptureError(
                f"{stream.name} waits on an event recorded outside the capture of "
                f"{self.graph.name}: a replay could not honour it. Record the event inside the "
                "capture, or wait before capturing.")
        _, src, index = mark
        with self.lock:
            if stream not in self.lanes:        # fork: the stream joins the capture
                self.lanes[stream] = -1
                stream.capture = self
            if stream is self.origin and src is not self.origin:
                self.joined[src] = max(self.joined.get(src, -1), index)

    def end(self) -> None:
        """Stop capturing on every stream; raise if a forked stream never joined back."""
        for s in self.lanes:
            s.capture = None
        for ev in self.graph._events:
            ev.captured_by = None
        loose = [s.name for s, last in self.lanes.items()
                 if s is not self.origin and last > self.joined.get(s, -1)]
        if loose:
            raise GraphCaptureError(
                f"the capture of {self.graph.name} ended with work on {', '.join(loose)} that "
                f"{self.origin.name} never waited for: record an event on each forked stream "
                "after its last task and make the capturing stream wait on it (join)")


class graph:
    """``with runtime.graph(g, stream=s):`` captures the work enqueued on ``s`` into ``g``."""

    def __init__(self, g: Graph, stream=None):
        if not isinstance(g, Graph):
            raise InvalidParamError(f"graph(g={g!r}): expected a runtime.Graph")
        if g._captured or g._nodes:
            raise GraphCaptureError(f"{g.name} was captured already: make a new runtime.Graph")
        self.g, self.stream = g, stream

    def __enter__(self) -> Graph:
        s = resolve_stream(self.stream)
        if capturing() is not None:
            raise GraphCaptureError("this thread is capturing a graph already: captures do "
                                    "not nest")
        if s.capture is not None:
            raise GraphCaptureError(f"{s.name} is part of another capture already")
        if not s.idle():
            s.synchronize()             # captured work must not depend on pending eager work
        self.cap = Capture(self.g, s)
        s.capture = self.cap
        _tls.capture = self.cap
        _count(1)
        return self.g

    def __exit__(self, exc_type, exc, tb) -> None:
        _count(-1)
        _tls.capture = None
        try:
            self.cap.end()
        except GraphCaptureError:
            self.g._nodes.clear()
            self.g._accesses.clear()
            if exc_type is None:
                raise
            return
        if exc_type is not None:
            self.g._nodes.clear()
            self.g._events.clear()
            self.g._accesses.clear()
            return
        if self.g.fuse:
            self.g._nodes[:] = _fused(self.g._nodes)
        self.g._captured = True
