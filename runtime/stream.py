"""Streams: ordered asynchronous task queues, each served by one worker thread.

Design note. A stream is a *timeline*: every enqueued task takes the next sequence value
(``issued``), and the worker advances ``done`` as tasks finish (or are skipped). Synchronizing on
anything - the stream, an event, the device - means "wait until ``done`` reaches a value". Events
are just (stream, value) pairs, so recording one costs no task unless it needs a timestamp.

Waking a sleeping thread costs tens of microseconds here, more than a small kernel, and spinning
under the GIL only makes it worse (measured). So a thread that synchronizes without a timeout
runs the tasks the worker has not started yet itself, in order, under the stream's execution
lock; the worker runs everything else. A thread blocked on the timeline is woken only when it
reaches the value it waits for, not at every task: each needless wake-up is a GIL hand-off with
the worker.

An idle worker sleeps on a *doorbell*, a lock used as a binary semaphore that an enqueue
releases; a thread that starts running the queue itself first takes back a ring the worker has
not answered yet. That is why the doorbell is not the stream's condition: a woken worker must
take the GIL before it can see that the work is already taken, and it takes it at the caller's
next release (numpy releases it for large arrays, a spinning hccl wait at every yield), which
then costs the caller a wake-up of its own to get it back. Taken back, the ring leaves the
worker asleep inside the lock, in C, never wanting the GIL. For the caller to get there first,
a worker woken for work a caller had already taken moves to SCHED_BATCH (a thread of that
class, once woken, does not take the core of the thread that woke it at once, but the next
free one or the next scheduling tick), and a worker woken for work nobody else runs moves back
to the default class, so asynchronous work (a collective on a communication stream) still
starts at once (``runtime.sched`` owns the moves). ``NPUSIM_SCHED_BATCH=0`` keeps workers in the
default class. Measured, 64 KiB
all_reduce at world 2 (an enqueue then a synchronize per call): 2.7 -> 0.3-0.7 involuntary
switches of the caller per call; medians of 6-8 alternating jobs 71 -> 45, 93 -> 62 and
97 -> 75 us in three A/Bs; the data-parallel example, which overlaps its AllReduces,
unchanged. An idle stream burns no core.

A graph replay is enqueued lazily (``enqueue_lazy``): the host nearly always synchronizes right
after it, so the worker is not rung while it patrols (it sleeps at most ``PATROL_S`` at a time
and runs such work nobody started); the patrol ends after ``PATROL_IDLE`` empty wake-ups.

A task that raises puts the stream in an error state: every task enqueued behind it is
skipped until the error is raised, once, by the first synchronize that observes it, as
TaskError chained to the original exception and naming the task and the line that enqueued it.
Work enqueued after that raise runs normally. The skip horizon is therefore not a timeline value
fixed when the task fails (whether the host had enqueued a follower by then is a race between
the host and the worker: 34 of 500 fresh streams ran their follower that way): ``_skip_until``
is infinite while the error is pending, and the raise, under ``_mu`` like every enqueue, sets it
to the last value issued before it. One value read per task, so the worker, a caller running the
queue and a graph replay see the same answer. A stream waiting on an event at or after the
failed task, while the error is still pending, fails its waiting task with the same error
(``_block_until``): its work behind the wait depends on the failed task's output.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time

from . import hooks, sched
from .callsite import callsite
from .current import StreamBase, current_context
from .errors import (GraphCaptureError, InvalidParamError, SyncTimeoutError, TaskError,
                     task_error_class)
from .event import Event

log = logging.getLogger("runtime.stream")
_ids = itertools.count(1)
_perf = time.perf_counter
_NEVER = float("inf")
# A worker that runs lazily enqueued work (``Stream.enqueue_lazy``: graph replays) sleeps at
# most PATROL_S at a time, and looks for such work at each wake-up, until PATROL_IDLE wake-ups
# in a row found none: a replay the host does not wait for starts within PATROL_S.
PATROL_S = 1e-3
PATROL_IDLE = 200


class _Task:
    __slots__ = ("fn", "name", "category", "meta", "site", "seq")


_new_task = object.__new__


def _done_task() -> None:
    """A task done before it was enqueued (``Stream.enqueue_begun``): its place in the order."""


class Stream(StreamBase):
    """An ordered queue of tasks on one device; different streams run concurrently.

    Args:
        priority: accepted for API fidelity (ACL priorities); all streams are served alike.
        name: a label for error messages, stacks and profile tracks (default ``stream <id>``).
    """

    def __init__(self, priority: int = 0, *, name: str | None = None, _ctx=None,
                 _name: str | None = None):
        if not isinstance(priority, int):
            raise InvalidParamError(f"Stream(priority={priority!r}): priority must be an int")
        self._ctx = _ctx if _ctx is not None else current_context()
        self.priority = priority
        self.id = next(_ids)
        self.name = name or _name or f"stream {self.id}"
        self.device_id = self._ctx.device_id
        self._q: collections.deque = collections.deque()
        # ``_mu`` is the Condition's lock: ``with self._mu`` where nothing waits or notifies
        # (the Condition's own ``__enter__`` is a Python call more, on every enqueue and task)
        self._mu = threading.Lock()
        self._cv = threading.Condition(self._mu)
        self._issued = 0
        self._done = 0
        self._skip_until = 0          # tasks with seq <= this are skipped: _NEVER while an
        #                               error is pending, the last value issued before its raise after
        self._error: TaskError | None = None
        self._error_seq = 0
        self._sleeping = False        # the worker waits for the doorbell (or is about to)
        self._rung = False            # the doorbell was released and not yet taken
        self._bell = threading.Lock()  # released = rung: the worker sleeps in acquire()
        self._bell.acquire()
        self._stealing = False        # a synchronizing thread holds _exec and runs the queue
        self._stealer = 0             # ... and this is its thread's ident
        self._wake_at = _NEVER          # lowest timeline value a blocked waiter needs
        self._patrol = False          # the sleeping worker wakes every PATROL_S (enqueue_lazy)
        self._patrols = 0             # its wake-ups in a row that found nothing to run
        self._running: _Task | None = None
        self._running_since = 0.0
        self._destroyed = False
        self._thread: threading.Thread | None = None
        self._exec = threading.Lock()       # held while a task runs: keeps the order
        self.capture = None                 # the runtime.graph Capture this stream is part of
        for fn in hooks.stream_created:     # the profiler names the stream's track
            fn(self)
        self._ctx._add_stream(self)

    # ------------------------------------------------------------------ timeline
    @property
    def issued(self) -> int:
        """The timeline value of the last task enqueued (0 before any)."""
        return self._issued

    @property
    def completed(self) -> int:
        """The timeline value the stream has reached: tasks up to it have finished (or were
        skipped after a failure)."""
        return self._done

    def reached(self, value: int) -> bool:
        """True once the task with timeline value ``value`` has finished (an event's query)."""
        return self._done >= value

    @property
    def destroyed(self) -> bool:
        """True once ``destroy()`` ran: the stream takes no more work."""
        return self._destroyed

    def query(self) -> bool:
        """True when every task enqueued so far has finished (the stream is idle)."""
        return self._done >= self._issued

    def runs_here(self) -> bool:
        """True when the calling thread is running one of this stream's tasks now: its worker,
        or a synchronizing thread that runs the queue itself (``runtime.memory`` asks it of
        memory freed while the stream's queued work may still use it)."""
        t = self._thread
        return self._running is not None and (
            (t is not None and t.ident == threading.get_ident()) or
            self._stealer == threading.get_ident())

    def idle(self) -> bool:
        """True when every task enqueued so far has finished and no task error waits for a
        synchronize: work run inline now follows the stream's work and hides no failure."""
        return self._done >= self._issued and self._error is None

    # ------------------------------------------------------------------ enqueue
    def enqueue(self, fn, name: str, category: str = "kernel", meta=None,
                site: str | None = None, lazy: bool = False) -> int:
        """Queue ``fn()`` to run in order on this stream's worker; returns at once.

        Returns the task's timeline value (``reached(value)`` tells when it is done). An
        exception from ``fn`` becomes the stream's sticky ``TaskError``, raised by the next
        synchronize. ``category`` and ``meta`` (a small dict of JSON-able values) go into the
        profile trace; ``site`` (file:line, the caller's when None) into errors; ``lazy``: see
        ``enqueue_lazy``.
        Raises InvalidParamError on a destroyed stream.
        """
        if self._destroyed:
            raise InvalidParamError(f"{self.name} was destroyed; create a new Stream")
        if site is None:
            site = callsite(2)
        if self.capture is not None:
            return self.capture.add(self, fn, None, name, category, meta, site)
        task = _new_task(_Task)       # no __init__: a Python call less on every enqueue
        task.fn, task.name, task.category, task.meta, task.site = fn, name, category, meta, site
        with self._mu:
            self._issued += 1
            task.seq = seq = self._issued
            self._q.append(task)
            if self._thread is None:
                self._patrol = lazy
                self._thread = threading.Thread(target=self._work, name=f"npu{self.device_id}-{self.name}",
                                                daemon=True)
                self._thread.start()
            elif lazy:
                self._patrols = 0
                if not self._patrol:    # it sleeps without a timeout: ring, patrol from now
                    self._patrol = True
                    self._ring()
            elif self._sleeping and not self._rung:     # _ring(), inline: every enqueue
                self._rung = True
                self._bell.release()
        return seq

    def enqueue_lazy(self, fn, name: str, category: str = "kernel", meta=None,
                     site: str | None = None) -> int:
        """``enqueue``, except that a sleeping worker that patrols is not rung: it finds the
        task at its next patrol, within ``PATROL_S``, unless a synchronize (which runs the
        queue itself), a wait or any other enqueue starts it first. For work that the host
        usually waits for right away (a task graph's replay, ``runtime.graph``): the ring
        wakes the worker, which then takes the GIL only to find its work taken, a hand-off
        that costs the caller more than a small replay. The first lazy task rings as
        ``enqueue`` does and starts the patrol; ``PATROL_IDLE`` patrols in a row with nothing
        to run end it (an idle stream burns no core). Raises as ``enqueue``."""
        return self.enqueue(fn, name, category, meta, callsite(2) if site is None else site, True)

    def enqueue_begun(self, begin, name: str, category: str = "kernel", meta=None,
                      site: str | None = None, args: tuple = ()) -> int | None:
        """If the stream is idle (``idle()``: nothing queued or running, no error pending) and
        not capturing, call ``begin()`` now, in the calling thread, holding the execution lock
        (nothing of this stream runs meanwhile, and nothing could come before it in the
        stream's order), and enqueue the task it returns; returns its timeline value. Returns
        None, having called nothing, when the stream is busy: enqueue the usual way then.
        ``args``: passed to ``begin`` (no partial to make per call).

        For a task whose first part never waits (hccl runs a small collective at the call as
        far as its messages are there: ``hccl.call.Call.begin``): ``begin`` must not block. It
        returns None when it did the whole task itself: the task is then complete at once (the
        timeline advances past it, the worker is not woken); if another thread enqueued on
        the stream meanwhile, an empty task behind that one stands for it, so the timeline
        still says done only when everything before is. An exception from ``begin``
        propagates and nothing is enqueued."""
        if self.capture is not None or self._done < self._issued or self._error is not None \
                or self._destroyed or not self._exec.acquire(False):
            return None
        try:
            issued = self._issued
            if self._done < issued or self._error is not None:
                return None
            fn = begin(*args)
            if fn is None:
                mu = self._mu
                mu.acquire()        # not ``with``: half the cost in CPython 3.11, every call
                try:
                    if self._issued == issued:      # nobody enqueued meanwhile: done, in order
                        self._issued = self._done = value = issued + 1
                        if value >= self._wake_at:
                            self._wake_at = _NEVER
                            self._cv.notify_all()
                        return value
                finally:
                    mu.release()
                fn = _done_task
            return self.enqueue(fn, name, category, meta, site)
        finally:
            self._exec.release()

    def enqueue_deferred(self, make, name: str, category: str = "kernel", meta=None,
                         site: str | None = None, fuse=None) -> int:
        """Queue the task ``make()`` returns: built now when eager, at every replay when the
        stream is capturing a graph (hccl's collectives take their sequence numbers then).
        ``fuse`` (a ``runtime.graph.Fusable``) lets a graph fuse the node with its neighbours.

        Raises GraphCaptureError when the calling thread captures a graph this stream is not
        part of (the task would run eagerly once, and not at the replays).
        """
        if site is None:
            site = callsite(2)
        if self.capture is not None:
            if self._destroyed:
                raise InvalidParamError(f"{self.name} was destroyed; create a new Stream")
            return self.capture.add(self, None, make, name, category, meta, site, fuse)
        cap = hooks.capture
        if cap is not None and cap.capturing() is not None:
            raise GraphCaptureError(
                f"'{name}' on {self.name}, which is not part of the capture of "
                f"{cap.capturing().graph.name}: make the stream join the capture (wait on an "
                "event recorded inside it) or issue it outside the capture")
        return self.enqueue(make(), name, category, meta, site)

    def _ring(self) -> None:
        """Wake the worker if it sleeps and is not woken yet (the caller holds ``_mu``)."""
        if self._sleeping and not self._rung:
            self._rung = True
            self._bell.release()

    # ------------------------------------------------------------------ worker
    def _work(self):
        q, mu, bell, ex = self._q, self._mu, self._bell, self._exec
        adapt, moved, woken = sched.adaptive_workers(), False, False
        while True:
            while True:
                with mu:
                    self._sleeping = not q or self._stealing
                    if not self._sleeping:
                        break
                    patrol = self._patrol
                if woken and adapt and not moved:   # this wake-up found its work taken
                    moved = sched.move(True)
                # a synchronizing thread running the queue itself rings again if it leaves work
                if patrol and not bell.acquire(True, PATROL_S):    # a patrol (enqueue_lazy)
                    woken = False
                    with mu:
                        if q and not self._stealing:
                            self._sleeping = False
                            break                   # a lazy task nobody started: run it
                        self._patrols += 1
                        if self._patrols >= PATROL_IDLE:
                            self._patrol = False    # sleep without a timeout again
                    continue
                if not patrol:
                    bell.acquire()
                woken = True
                with mu:
                    self._rung = False
            if moved:                               # work nobody else runs: no more waiting
                moved = not sched.move(False)
            with ex:
                while q:
                    task = q.popleft()
                    if task is None:      # destroy()
                        return
                    self._run(task)
                    task = None           # drop the closure: its arrays must be freeable
            woken = False

    def _run(self, task: _Task) -> None:
        """Run (or skip) one task; the caller holds the execution lock."""
        if task.seq > self._skip_until:
            self._running, self._running_since = task, _perf()
            prof = hooks.profiler
            t0 = prof.task_start() if prof is not None else None
            try:
                task.fn()
            except BaseException as exc:  # noqa: BLE001 - any failure becomes the stream's error
                self._fail(task, exc)
            if t0 is not None:
                prof.task_end(t0, self.id, task.name, task.category, task.meta, task.site,
                                  task.seq)
            self._running = None
        with self._mu:
            self._done = task.seq
            if task.seq >= self._wake_at:   # not at every task: a waiter woken early only
                self._wake_at = _NEVER      # sleeps again, at a GIL hand-off's cost
                self._cv.notify_all()

    def _fail(self, task: _Task, exc: BaseException) -> None:
        cls = task_error_class(type(exc))
        with self._cv:
            self._skip_until = _NEVER     # until the error is raised (see the module note)
            if self._error is None:
                where = (f"\n  task '{task.name}' on {self.name} (device {self.device_id}) enqueued at "
                         f"{task.site}")
                if cls is TaskError:
                    msg = f"task '{task.name}' failed: {type(exc).__name__}: {exc}{where}"
                else:  # the library's own message stays the first line
                    msg = f"{exc}{where}"
                err = cls.__new__(cls)
                Exception.__init__(err, msg)
                if cls is not TaskError:
                    err.__dict__.update(exc.__dict__)
                err.code = TaskError.code
                err.task, err.site, err.stream = task.name, task.site, self.name
                err.__cause__ = exc
                self._error, self._error_seq = err, task.seq
        if not isinstance(exc, KeyboardInterrupt):   # a Ctrl-C is no task's failure
            # A library error (a peer's death, a timeout) is raised at the synchronize with its
            # own one-line message: logging it here too printed every released rank twice.
            # A user kernel's exception stays at ERROR, in case nothing ever synchronizes.
            level = logging.ERROR if cls is TaskError else logging.INFO
            log.log(level, "task %s on %s failed: %s (enqueued at %s)", task.name, self.name,
                      str(exc).splitlines()[0] if str(exc) else repr(exc), task.site)

    # ------------------------------------------------------------------ waiting
    def wait_value(self, value: int, timeout: float | None = None,
                   what: str = "Stream.wait_value") -> None:
        """Block until the timeline reaches ``value``; raise a pending task error up to it, once.

        Raises:
            TaskError: a task up to ``value`` failed since the last synchronize.
            SyncTimeoutError: ``timeout`` seconds passed first (``what`` names the call).
        """
        cap = hooks.capture
        if cap is not None:
            cap.refuse(what)
        if self._done < value and timeout is None:
            self._steal(value)
        if self._done < value:
            deadline = None if timeout is None else _perf() + timeout
            with self._cv:
                while self._done < value:
                    left = None if deadline is None else deadline - _perf()
                    if left is not None and left <= 0:
                        raise self._timeout_error(timeout, what, value)
                    self._wake_at = min(self._wake_at, value)
                    self._cv.wait(left)
        if self._error is not None:
            self._raise_error_upto(value)

    def _steal(self, value: int) -> None:
        """Run queued tasks up to ``value`` in the waiting thread if the worker has not started them.

        Waking a sleeping thread costs tens of microseconds, more than a small kernel: a caller
        that is going to block anyway runs the work itself, in order, under the execution lock.
        """
        q = self._q
        if q and q[0] is not None and self._exec.acquire(blocking=False):
            # while _stealing, a worker woken by enqueue goes back to sleep instead of blocking
            # on the execution lock and waking a second time when it is released; a ring it
            # has not answered yet is taken back (see the module note)
            with self._mu:
                self._stealing = True
                self._stealer = threading.get_ident()
                if self._rung and self._bell.acquire(False):    # take back a ring the worker
                    self._rung = False                          # has not taken: it sleeps on
            try:
                while self._done < value and q and q[0] is not None:
                    self._run(q.popleft())
            finally:
                with self._mu:
                    self._stealing = False
                    self._stealer = 0
                    self._exec.release()
                    if q:
                        self._ring()

    def _raise_error_upto(self, value: int) -> None:
        """Raise the pending task error if it is at or before ``value``; from then on the
        stream runs what is enqueued after this raise (everything before it is skipped)."""
        if self._error is not None and self._error_seq <= value:
            with self._cv:
                err, self._error = self._error, None
                if err is not None:
                    self._skip_until = self._issued
                    skipped = self._issued - self._error_seq
            if err is not None:
                if skipped:
                    err.args = (f"{err.args[0]}; {skipped} task(s) enqueued behind it were "
                                "skipped",) + err.args[1:]
                raise err

    def _timeout_error(self, timeout, what, value) -> SyncTimeoutError:
        run = self._running
        running = (f"running '{run.name}' (enqueued at {run.site}) for "
                   f"{_perf() - self._running_since:.1f} s" if run else "idle")
        return SyncTimeoutError(
            f"{what} timed out after {timeout:.3g} s on {self.name} (device {self.device_id}): "
            f"{value - self._done} task(s) still pending, {running}. Nothing was cancelled: the work "
            f"goes on and the stream stays usable; synchronize again, or find what blocks the task.")

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until every task enqueued so far has finished.

        Raises:
            TaskError: a task failed since the last synchronize (raised once).
            SyncTimeoutError: ``timeout`` seconds passed first (code 507046); nothing changes.
        """
        value = self._issued
        if timeout is None and hooks.capture is None:    # wait_value's common case, inline
            if self._done < value:
                self._steal(value)
            if self._done < value or self._error is not None:
                self.wait_value(value, None, "Stream.synchronize")
        else:
            self.wait_value(value, timeout, "Stream.synchronize")
        chk = hooks.stream_check
        if chk is not None:
            chk.host_waits_stream(self, value)

    def wait_event(self, event) -> None:
        """Make later work on this stream wait until ``event`` completes (aclrtStreamWaitEvent)."""
        if not isinstance(event, Event):
            raise InvalidParamError(f"wait_event(event={event!r}): expected a runtime.Event")
        if self.capture is not None or event.captured_by is not None:
            (self.capture or event.captured_by[0]).wait(self, event)
            return
        point = event.point
        if point is None:
            return
        src, value = point
        if src is self:
            return  # already ordered by the stream itself
        # an event reached with no failure to pass on (``_block_until``) needs no task: it would
        # be a no-op, and would keep an idle stream from running its next call at once
        if src._done < value or src._error is not None:
            self.enqueue(lambda: src._block_until(value), name="wait_event", category="event",
                         site=callsite(2))
        chk = hooks.stream_check
        if chk is not None:
            chk.stream_waits_event(self, event)

    def wait_stream(self, other: "Stream") -> None:
        """Make later work on this stream wait for the work enqueued on ``other`` so far."""
        if not isinstance(other, Stream):
            raise InvalidParamError(f"wait_stream(other={other!r}): expected a runtime.Stream")
        if other is self:
            return
        if self.capture is not None or other.capture is not None:
            self.wait_event(other.record_event())     # a fork or join of a graph capture
            return
        value = other._issued
        self.enqueue(lambda: other._block_until(value), name="wait_stream", category="event",
                      site=callsite(2))
        chk = hooks.stream_check
        if chk is not None:
            chk.stream_waits_stream(self, other, value)

    def run_queue_until(self, value: int) -> None:
        """Run this stream's queued tasks up to timeline ``value`` in the calling thread, in
        order, if the worker has not started them (what a synchronize does before it blocks:
        waking a sleeping worker costs more than a small task); return at once when they are
        done or the worker is running them. Raises nothing of a task (``block_until`` does):
        another stream's task that is about to ``block_until(value)`` calls it first."""
        if self._done < value:
            self._steal(value)

    def block_until(self, value: int) -> None:
        """Block the calling thread (another stream's task) until this stream's timeline
        reaches ``value``; a task failure up to ``value`` that no synchronize has raised yet is
        raised here too, with the same error (it stays pending on this stream)."""
        self._block_until(value)

    def _block_until(self, value: int) -> None:
        """Wait (from another stream's worker) for the timeline. A task failure up to ``value``
        that no synchronize has raised yet fails the waiting task too, with the same error (so
        the waiting stream's later work is skipped, as work behind a failed task on one stream
        is); it stays pending here as well."""
        if self._done < value:
            with self._cv:
                while self._done < value:
                    self._wake_at = min(self._wake_at, value)
                    self._cv.wait(1.0)
        err = self._error
        if err is not None and self._error_seq <= value:
            raise err.__cause__ if err.__cause__ is not None else err

    def record_event(self, event=None):
        """Record ``event`` (a new one when None) on this stream and return it."""
        ev = Event() if event is None else event
        ev.record(self)
        return ev

    def destroy(self) -> None:
        """Finish the pending work and stop the worker; the stream is unusable afterwards."""
        if self._destroyed:
            return
        if self is self._ctx.default_stream:
            raise InvalidParamError("the default stream cannot be destroyed")
        try:
            self.synchronize()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._destroyed = True
        with self._mu:
            if self._thread is not None:
                self._q.append(None)
                self._ring()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._ctx._remove_stream(self)

    def __repr__(self):
        return f"<runtime.Stream {self.name} device={self.device_id} issued={self._issued} done={self._done}>"
