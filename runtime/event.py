"""Events: points on a stream's timeline (aclrtEvent / torch.npu.Event)."""
from __future__ import annotations

import time

from . import hooks
from .callsite import callsite
from .current import resolve_stream
from .errors import InvalidParamError, NpuError


class Event:
    """A marker of the work enqueued on a stream before ``record``.

    A never-recorded event is complete. With ``enable_timing`` the event records the time the
    stream reached it, for ``elapsed_time``.
    """

    def __init__(self, enable_timing: bool = False):
        self.enable_timing = bool(enable_timing)
        self._stream = None
        self._value = 0
        self._time: float | None = None
        self._gen = 0
        self.captured_by = None     # (Capture, stream, node index) while recorded in a capture

    @property
    def point(self):
        """``(stream, timeline value)`` the event captured, or None before ``record``."""
        if self._stream is None:
            return None
        return self._stream, self._value

    def record(self, stream=None) -> None:
        """Capture the work enqueued on ``stream`` (the current stream when None) so far."""
        s = resolve_stream(stream)
        if s.capture is not None:       # a node of the graph; pointed at each replay
            s.capture.record(self, s, self._stamp if self.enable_timing else None)
            return
        if self.enable_timing:
            self._gen += 1
            gen = self._gen
            self._time = None

            def stamp():
                if self._gen == gen:
                    self._time = time.perf_counter()
            value = s.enqueue(stamp, name="event_record", category="event", site=callsite(2))
        else:
            value = s.issued
        self._stream, self._value = s, value
        chk = hooks.stream_check
        if chk is not None:
            chk.event_recorded(self, s, value)

    def _stamp(self) -> None:
        self._time = time.perf_counter()

    def replayed(self, stream, value: int) -> None:
        """Point the event at a graph replay (``runtime.graph``): the task ``value`` of
        ``stream`` runs the node that records it."""
        self._gen += 1
        self._time = None
        self._stream, self._value = stream, value

    def query(self) -> bool:
        """True once the captured work has finished (or the event was never recorded)."""
        t = self.point
        if t is None:
            return True
        done = t[0].reached(t[1])
        if done:                # a completed query orders the host after the event
            chk = hooks.stream_check
            if chk is not None:
                chk.host_waits_event(self)
        return done

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until the captured work has finished.

        Raises:
            TaskError: a task captured by this event failed (raised once per failure).
            SyncTimeoutError: ``timeout`` passed first (code 507046); nothing changes.
        """
        cap = hooks.capture
        if cap is not None:
            cap.refuse("Event.synchronize")
        t = self.point
        if t is not None:
            t[0].wait_value(t[1], timeout, "Event.synchronize")
            chk = hooks.stream_check
            if chk is not None:
                chk.host_waits_event(self)

    def wait(self, stream=None) -> None:
        """Make ``stream`` (the current stream when None) wait for this event."""
        resolve_stream(stream).wait_event(self)

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds between this event and ``end_event`` (both recorded with timing, complete)."""
        if not isinstance(end_event, Event):
            raise InvalidParamError(f"elapsed_time(end_event={end_event!r}): expected a runtime.Event")
        for name, ev in (("start", self), ("end", end_event)):
            if not ev.enable_timing:
                raise InvalidParamError(f"elapsed_time: the {name} event was created without "
                                        "enable_timing=True")
            if ev._stream is None:
                raise InvalidParamError(f"elapsed_time: the {name} event was never recorded")
            if not ev.query() or ev._time is None:
                raise NpuError(f"elapsed_time: the {name} event has not completed yet; "
                               "synchronize it first", code=507018)
        return (end_event._time - self._time) * 1e3

    def __repr__(self):
        state = "unrecorded" if self._stream is None else ("complete" if self.query() else "pending")
        return f"<runtime.Event {state}>"
