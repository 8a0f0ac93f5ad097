"""The "hccl" torch backend's Work objects, the thread that completes them, and the staging of
tensors in device memory.

Design note. A torch collective on this backend is: stage the tensors into device memory (on
the calling thread), enqueue the hccl collective on the process group's stream, record an event.
One completer thread per process group then synchronizes those events in call order, copies the
results back into the tensors and completes each Work's ``torch.futures.Future`` (with the
output tensors, or with npusim's exception). A Work whose event is reached when it is submitted
(the call ran whole at its issue) and that queues behind no other completes right there, in
the calling thread (``Completer``).

How a failure reaches torch. ``torch.futures.Future.set_exception`` does not fail the future:
it stores the exception as the future's *value* and teaches only the Python wrapper to raise
it. C++ readers of the future never see an error: DistributedDataParallel's reducer, after
backward, reads each bucket's future as a successful one, finds no tensor in it and indexes
the empty list (``parseCppCommHookResult``): a SIGSEGV in the backward engine on every rank
that survived a dead peer. So a Work fails its future the way torch's C++ understands: the
future ``get_future()`` returns is a ``then`` of an inner one, whose callback raises the
error; torch marks that future failed (a RuntimeError carrying npusim's message, as gloo's
"Connection reset by peer"), and DDP raises it from ``backward()``. ``Work.wait()`` raises
npusim's own exception instead, type and all. The error is noted with
``hccl.failure.handed_to_torch``, so the bootstrap can tell which npusim error torch's
RuntimeError stands for (a released rank is a victim, not a culprit).

A stream skips the tasks queued behind a failed one, and a failed collective aborts its
communicator, so once a Work of a group has failed, every later Work of that group fails with
the same error instead of reporting stale buffers as results.

At interpreter exit the completer thread must not be inside torch (``set_result``, the copies
and releasing tensors release the GIL in C++): runtime/torch/exitgate.py's gate keeps it out, so
a Work's references are all dropped inside the gate (``Completer._complete``).
"""
from __future__ import annotations

import collections
import queue
import threading

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

import runtime
from runtime import sanitizer
from runtime.context import contexts_by_device, current_stream_of
from runtime.dtypes import DtypeMap
from runtime.torch import device as npu_device
from runtime.torch.exitgate import GATE

from ..errors import InvalidArgumentError
from ..failure import handed_to_torch

_DTYPES = DtypeMap({torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
           torch.float16: np.dtype(np.float16), torch.bfloat16: "bfloat16",
           torch.int8: np.dtype(np.int8), torch.int16: np.dtype(np.int16),
           torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64),
           torch.uint8: np.dtype(np.uint8), torch.bool: np.dtype(np.uint8)})
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = np.dtype(_name)


class Work(dist._Work):
    """One collective in flight: ``wait()`` blocks until its results are in the tensors.

    ``wait()`` raises npusim's error (``CollectiveMismatchError``, ``HcclTimeoutError``,
    ``RemoteRankError``, ...) if the collective failed; ``get_future()`` is completed with the
    output tensors, or failed with a RuntimeError carrying that error's message (torch's C++,
    DDP's reducer included, reads it; see the module note).
    """

    # what every Work starts with, as class attributes (set per Work only when it changes:
    # the npu all_reduce makes one per call). ``_done`` / ``_fut``: made at first need
    # (``get_future``, a wait for a Work not finished: most calls finish at the call and
    # nobody asks): ``_done`` is completed with None or the error by ``complete``; ``_fut``
    # follows it at once, in torch's terms (the callback holds the outputs, never the Work:
    # no cycle through C++)
    _error: BaseException | None = None
    _finished = False        # complete() ran (and completed the futures, if made)
    _done: Future | None = None
    _fut: Future | None = None
    source = -1              # the sender of a receive from any source
    _after = None            # (NPU, end event) of a collective on npu tensors (npu.py)
    _pending = None          # the Completer that holds this Work deferred (``defer``)

    def __init__(self, name: str, outputs: list):
        super().__init__()
        self.name = name
        self._outputs = outputs

    def order_after(self, dev: int, event) -> None:
        """This Work's collective ran on npu tensors of NPU ``dev`` and ends at ``event``:
        ``wait()`` then orders the caller's current stream after it instead of blocking."""
        self._after = (dev, event)

    def wait(self, timeout=None) -> bool:
        """CPU tensors: block until the results are in them. npu tensors: make the calling
        thread's current stream of their NPU wait for the collective and return at once
        (torch_npu's ProcessGroupHCCL); an error already known is raised."""
        if self._after is None:
            if self._finished and self._error is None:  # done at the call: nothing to wait for
                return True
            return self.synchronize()
        if self._error is not None:
            raise self._error
        dev, event = self._after
        ctx = contexts_by_device.get(dev)
        point = event.point
        if ctx is None or sanitizer.on or event.captured_by is not None or point is None:
            with npu_device.on(dev):            # the runtime's own wait_event: every case
                runtime.current_stream().wait_event(event)
            return True
        cur = current_stream_of(ctx)
        src, value = point
        if src is cur or cur.capture is not None:
            cur.wait_event(event)
        elif not src.idle():       # else: reached, no error pending: no task
            # the runtime's wait task, except that whoever runs it (the host's synchronize,
            # usually) first runs the collective's queued rest itself rather than wait for
            # the communication stream's worker to wake for it; lazily enqueued: the host
            # runs it (Stream.enqueue_lazy)
            cur.enqueue_lazy(_after_stream(src, value), "wait_event", "event")
        return True

    def synchronize(self) -> bool:
        """Block until the collective completed (its results are in the tensors)."""
        # no deadline of its own: every wait inside the collective is bounded by HCCL_EXEC_TIMEOUT.
        # The outer future, not the inner: it completes last (torch runs the callback after
        # waking the inner one's waiters), and is_completed() must be true once this returns
        if not self._finished:
            try:
                self.get_future().wait()
            except RuntimeError:        # torch's words for our error: raise npusim's own
                if self._error is None:
                    raise
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> Future:
        fut = self._fut
        if fut is not None:
            return fut
        if self._pending is not None and not self._finished:
            self._pending.hand_over()       # a deferred Work: the thread completes it now
        with _FUTURES:
            fut = self._fut
            if fut is not None:
                return fut
            self._done = Future()
            fut = self._fut = self._done.then(_outcome(self._outputs))
            fire = self._finished       # complete() came first: it left the futures to us
        if fire:
            self._fire()
        return fut

    def is_completed(self) -> bool:
        if not self._finished:
            if self._pending is not None:
                self._pending.poll()        # a deferred Work: completed if its end is reached
            fut = self._fut     # done once complete() fired it (it sets _finished just after)
            return self._finished or (fut is not None and fut.done())
        return True

    def is_success(self) -> bool:
        return self._finished and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._outputs

    def __repr__(self):
        state = "failed" if self._error else ("completed" if self._finished else "pending")
        return f"<hccl torch Work {self.name} {state}>"

    def _source_rank(self) -> int:
        # torch's name: ``dist.recv`` without ``src`` asks the Work who sent
        return self.source

    def complete(self, error: BaseException | None) -> None:
        """Deliver the outputs (``error`` None) or ``error`` to every waiter."""
        with _FUTURES:
            self._error = error
            fire = self._done is not None
            if not fire:                # no futures yet: get_future() completes them
                self._finished = True
        if fire:
            self._fire()
            self._finished = True       # once the futures are done: is_completed() follows

    def _fire(self) -> None:
        if GATE.enter():         # not at interpreter exit (runtime/torch/exitgate.py)
            try:
                self._done.set_result(self._error)
            finally:
                GATE.leave()


def _nothing() -> None:
    pass


_FUTURES = threading.Lock()     # a Work's futures are made or completed once: by one of
#                                 get_future() and complete(), whichever sees the other's part


def _after_stream(src, value: int):
    """The task that orders a stream after ``src`` reached ``value`` (``Stream.block_until``,
    the failure rule of ``Stream.wait_event``): it first runs ``src``'s queued tasks up to
    ``value`` in its own thread when ``src``'s worker has not started them
    (``Stream.run_queue_until``, as a synchronize does), instead of waking that worker and
    waiting for it (measured: the 1 KiB npu all_reduce + torch.npu.synchronize paid ~300 us
    for the two threads' hand-off)."""
    def wait_stream() -> None:
        src.run_queue_until(value)
        src.block_until(value)
    return wait_stream


def _outcome(outputs: list):
    """The callback that turns the inner future's value (None or an error) into the outcome
    torch reads: the outputs, or a failed future (raising is the one way to fail a future)."""
    def outcome(done: Future) -> list:
        error = done.value()
        if error is not None:
            handed_to_torch(error)
            raise error
        return outputs
    return outcome


class Completer:
    """Completes a process group's Works in call order on one daemon thread.

    A Work whose end event is already reached when it is submitted, with none of the group's
    Works still queued, completes at once in the submitting thread instead (a small call on
    an idle stream runs whole at its issue: handing its completion to the thread cost a wake-up
    and GIL hand-offs per call). Order holds: a Work completes inline only while nothing is
    queued or deferred, and the thread counts a Work as queued until it has completed it. With
    the stream sanitizer on, every Work goes to the thread, whose event wait is the one it models.

    A Work may also be *deferred* (``defer``: the npu all_reduce that did not finish at its
    issue): it waits, in order, without waking the thread, for the group's next call
    (``submit``, ``finished``, ``defer``), which completes it in its own thread if its end is
    reached and hands it to the thread otherwise, or for its own ``is_completed`` (which
    completes it if reached) or ``get_future`` / ``synchronize`` (which hand it over); ``close``
    hands over what is left. Measured: waking the thread for each late 1 KiB all_reduce cost the
    caller more than the collective (the thread's wake-up and GIL hand-offs)."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._lock = threading.Lock()
        self._queued = 0            # submitted to the thread and not yet completed by it
        self._deferred: collections.deque = collections.deque()    # ``defer``'s, in order
        self._draining = threading.RLock()      # held while deferred Works complete inline
        self._thread = threading.Thread(target=self._loop, name=f"hccl-torch-{name}", daemon=True)
        self._thread.start()

    def submit(self, work: Work, event, finish, cleanup) -> None:
        """Complete ``work`` once ``event`` is reached: ``finish()`` copies results back,
        ``cleanup()`` releases staging memory whatever happened."""
        if self._deferred:
            self.hand_over()
        item = [work, event, finish, cleanup]
        del work, finish, cleanup
        with self._lock:
            inline = self._queued == 0 and not self._deferred and not sanitizer.on and \
                event.query()
            if not inline:
                self._queued += 1
                self._queue.put(item)
                return
        self._complete(item)

    def finished(self, work: Work) -> bool:
        """Complete ``work`` now, in the calling thread, if none of the group's Works is
        queued (its collective ran whole at its issue: nothing to wait for, no copies, no
        staging); False, having done nothing, otherwise (``submit`` it then)."""
        if self._deferred and not self._drain(False):
            return False
        with self._lock:
            if self._queued or self._deferred or sanitizer.on:
                return False
        if work._done is None:          # no futures (a Work just made): ``complete``'s part
            work._error = self._failed
            work._finished = True
        else:
            work.complete(self._failed)     # enters the exit gate if it calls into torch
        return True

    def defer(self, work: Work, event, cleanup) -> None:
        """Complete ``work`` once ``event`` is reached, as ``submit`` with nothing to copy back,
        but without waking the thread (see the class note); ``cleanup()`` releases what the
        collective kept alive."""
        if self._queued or sanitizer.on:
            self.submit(work, event, _nothing, cleanup)
            return
        if self._deferred:
            self.poll()         # the earlier ones first: those reached complete here
        work._pending = self
        with self._lock:
            self._deferred.append([work, event, _nothing, cleanup])

    def poll(self) -> None:
        """Complete the deferred Works whose end is reached, in order, in this thread (if no
        other thread does it now)."""
        if self._deferred and self._draining.acquire(False):
            try:
                self._drain(False)
            finally:
                self._draining.release()

    def hand_over(self) -> None:
        """Complete the deferred Works whose end is reached here, hand the others to the
        thread."""
        self._drain(True)

    def _drain(self, hand_over: bool) -> bool:
        """Complete deferred Works in order while their end is reached and nothing is queued;
        the rest go to the thread when ``hand_over``. True when nothing is deferred now."""
        with self._draining:
            while True:
                with self._lock:
                    d = self._deferred
                    if not d:
                        return True
                    item = d[0]
                    if not self._queued and not sanitizer.on and item[1].query():
                        d.popleft()
                    elif hand_over:
                        self._queued += len(d)
                        for it in d:
                            self._queue.put(it)
                        d.clear()
                        return True
                    else:
                        return False
                self._complete(item)

    def again(self, work: Work, t) -> bool:
        """Whether ``work``, completed with success at its call on tensor ``t`` alone and with
        no futures made, may stand for a new call on ``t`` that ``finished`` would complete with
        success now (nothing queued or deferred, no failure): it is then as a new Work."""
        with self._lock:
            if self._queued or self._deferred or sanitizer.on or self._failed:
                return False
        return work._finished and work._error is None and work._done is None and \
            work._after is None and len(work._outputs) == 1 and work._outputs[0] is t

    def close(self) -> None:
        self.hand_over()
        self._queue.put(None)

    def _complete(self, item: list) -> None:
        """Complete the Work of ``item`` ([work, event, finish, cleanup]) and empty ``item``:
        its references to torch objects are dropped inside the exit gate (module note)."""
        error = self._failed
        try:
            item[1].synchronize()
        except BaseException as e:  # noqa: BLE001 - every failure goes to the waiter
            error = self._failed = e   # the stream's error is already hccl's type
        if not GATE.enter():         # the interpreter exits: no copy, nobody to complete
            GATE.keep(item)
            return
        try:
            work, _, finish, cleanup = item
            item.clear()
            try:
                if error is None:
                    try:
                        finish()
                    except BaseException as e:  # noqa: BLE001
                        error = self._failed = e
                try:
                    cleanup()
                except Exception:  # releasing staging memory must not mask the result
                    pass
                work.complete(error)
            finally:
                work = finish = cleanup = None
        finally:
            GATE.leave()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._complete(item)
            finally:
                with self._lock:
                    self._queued -= 1


# ---------------------------------------------------------------------- tensors <-> device memory
def np_dtype(t: torch.Tensor, api: str) -> np.dtype:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{api}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in ("cpu", "npu"):
        raise InvalidArgumentError(f"{api}: tensor is on {t.device}; the npusim hccl backend "
                                   "takes CPU and npu tensors")
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise InvalidArgumentError(f"{api}: dtype {t.dtype} is not supported by hccl "
                                   f"(supported: {', '.join(str(d) for d in _DTYPES)})")
    return dt


def as_tensor(flat: np.ndarray, dtype: torch.dtype, shape) -> torch.Tensor:
    """A torch tensor sharing ``flat``'s memory (bfloat16 goes through int16: numpy has none)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(flat.view(np.int16)).view(torch.bfloat16).view(shape)
    if dtype == torch.bool:     # bytes 0 / 1 on the wire, as gloo's bool
        return torch.from_numpy(flat).view(torch.bool).view(shape)
    return torch.from_numpy(flat).view(shape)


class Spares:
    """A process group's staging buffers kept for its next calls, at most ``LIMIT`` bytes: a
    CPU tensor's repeated collective then stages through the very buffer of its last call and
    finds the Call the communicator bound for it (hccl/call.py) instead of allocating a buffer
    and checking and planning the collective again (measured: most of a 1 KiB CPU all_reduce).
    A spare was last used by a collective whose Work completed: nothing still reads it."""

    LIMIT = 16 << 20

    def __init__(self):
        self._free: dict = {}       # (count, dtype) -> [device arrays]
        self._bytes = 0
        self._lock = threading.Lock()
        self._closed = False

    def take(self, key):
        with self._lock:
            got = self._free.get(key)
            if got:
                a = got.pop()
                self._bytes -= a.nbytes
                return a
        return None

    def give(self, key, a) -> None:
        with self._lock:
            keep = not self._closed and self._bytes + a.nbytes <= self.LIMIT
            if keep:
                self._free.setdefault(key, []).append(a)
                self._bytes += a.nbytes
        if not keep:
            a.free()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            arrays = [a for got in self._free.values() for a in got]
            self._free.clear()
            self._bytes = 0
        for a in arrays:
            a.free()


class Staging:
    """The device buffers of one collective call; given back to the group's ``spares`` (or
    freed) when the Work completes."""

    def __init__(self, spares: Spares | None = None):
        self.arrays: list = []
        self._spares = spares

    def buffer(self, count: int, dtype: np.dtype):
        key = (count, dtype)
        a = None if self._spares is None else self._spares.take(key)
        if a is None:
            # the pool hands out memory in the current stream's order: work still queued there
            # may use the block's former tensor, and the host reads and writes staging buffers
            # at once (after FSDP2's steps on npu, DCP's object collectives read garbage sizes)
            runtime.current_stream().synchronize()
            a = runtime.empty(count, dtype)
        self.arrays.append((key, a))
        return a

    def free(self) -> None:
        spares = self._spares
        for key, a in self.arrays:
            if spares is None:
                a.free()
            else:
                spares.give(key, a)
        self.arrays.clear()


def view(a, start: int = 0, count: int | None = None) -> np.ndarray:
    """Typed numpy view of ``count`` elements of device array ``a`` from element ``start``."""
    count = a.size - start if count is None else count
    if count == 0:
        return np.empty(0, a.dtype)
    item = a.dtype.itemsize
    return runtime.host_view(a)[start * item:(start + count) * item].view(a.dtype)


def put(a, start: int, t: torch.Tensor) -> None:
    """Copy tensor ``t`` (any strides) into device array ``a`` at element ``start``."""
    if t.numel():
        as_tensor(view(a, start, t.numel()), t.dtype, t.shape).copy_(t.detach())


def take(a, start: int, t: torch.Tensor) -> None:
    """Copy ``t.numel()`` elements of device array ``a`` from ``start`` into tensor ``t``."""
    if t.numel():
        with torch.no_grad():
            t.copy_(as_tensor(view(a, start, t.numel()), t.dtype, t.shape))


def same_dtype(tensors, api: str) -> np.dtype:
    dts = {np_dtype(t, api) for t in tensors}
    if len(dts) != 1:
        raise InvalidArgumentError(f"{api}: tensors have different dtypes {sorted(map(str, dts))}")
    return dts.pop()


def check_numel(t, want: int, api: str, name: str, what: str) -> None:
    if t.numel() != want:
        raise InvalidArgumentError(f"{api}: {name} has {t.numel()} elements but needs {want} "
                                   f"({what})")


def check_list(tensors, size: int, n: int, api: str, name: str) -> None:
    if len(tensors) != size:
        raise InvalidArgumentError(f"{api}: {name} holds {len(tensors)} tensors but the group "
                                   f"has {size} ranks")
    bad = [i for i, t in enumerate(tensors) if t.numel() != n]
    if bad:
        raise InvalidArgumentError(f"{api}: {name}[{bad[0]}] has {tensors[bad[0]].numel()} "
                                   f"elements but the input has {n}; hccl needs equal sizes")


def splits(t, sizes, size: int, api: str, name: str) -> list[int]:
    """Rows of ``t`` per rank: ``sizes`` checked, or an even split when it is empty."""
    rows = t.shape[0] if t.dim() else t.numel()
    if not sizes:
        if rows % size:
            raise InvalidArgumentError(f"{api}: {name} has {rows} rows, not divisible by the "
                                       f"{size} ranks; pass {name}_split_sizes")
        return [rows // size] * size
    sizes = [int(s) for s in sizes]
    if len(sizes) != size or any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise InvalidArgumentError(f"{api}: {name}_split_sizes={sizes} must be {size} "
                                   f"non-negative row counts summing to {name}'s {rows} rows")
    return sizes
