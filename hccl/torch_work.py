"""The Work objects the "hccl" torch backend returns, and the thread that completes them.

Design note. A torch collective on this backend is: stage the tensors into device memory (on
the calling thread), enqueue the hccl collective on the process group's stream, record an event.
One completer thread per process group then synchronizes those events in call order, copies the
results back into the tensors and completes each Work's ``torch.futures.Future`` (with the
output tensors, or with npusim's exception). ``Work.wait()`` and ``Work.get_future()`` (what
DistributedDataParallel chains its bucket callbacks on) both read that future, so an error
reaches whoever waits, with npusim's own type and message.

A stream skips the tasks queued behind a failed one, and a failed collective aborts its
communicator, so once a Work of a group has failed, every later Work of that group fails with
the same error instead of reporting stale buffers as results.
"""
from __future__ import annotations

import queue
import threading

import torch.distributed as dist
from torch.futures import Future


class Work(dist._Work):
    """One collective in flight: ``wait()`` blocks until its results are in the tensors.

    ``wait()`` raises npusim's error (``CollectiveMismatchError``, ``HcclTimeoutError``,
    ``RemoteRankError``, ...) if the collective failed; ``get_future()`` is completed with the
    output tensors (or that error).
    """

    def __init__(self, name: str, outputs: list):
        super().__init__()
        self.name = name
        self._outputs = outputs
        self._fut: Future = Future()
        self._error: BaseException | None = None

    def wait(self, timeout=None) -> bool:
        # no deadline of its own: every wait inside the collective is bounded by HCCL_EXEC_TIMEOUT
        self._fut.wait()
        return True

    def get_future(self) -> Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._outputs

    def __repr__(self):
        state = "failed" if self._error else ("completed" if self._fut.done() else "pending")
        return f"<hccl torch Work {self.name} {state}>"

    def _finish(self, error: BaseException | None) -> None:
        if error is None:
            self._fut.set_result(self._outputs)
        else:
            self._error = error
            self._fut.set_exception(error)


class Completer:
    """Completes a process group's Works in call order on one daemon thread."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"hccl-torch-{name}", daemon=True)
        self._thread.start()

    def submit(self, work: Work, event, finish, cleanup) -> None:
        """Complete ``work`` once ``event`` is reached: ``finish()`` copies results back,
        ``cleanup()`` releases staging memory whatever happened."""
        self._queue.put((work, event, finish, cleanup))

    def close(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, event, finish, cleanup = item
            error = self._failed
            try:
                event.synchronize()
                if error is None:
                    finish()
            except BaseException as e:  # noqa: BLE001 - every failure goes to the waiter
                error = self._failed = _unwrap(e)
            finally:
                try:
                    cleanup()
                except Exception:  # releasing staging memory must not mask the result
                    pass
            work._finish(error)


def _unwrap(e: BaseException) -> BaseException:
    """npusim's collective error rather than the stream's TaskError wrapper around it."""
    cause = e.__cause__
    from .errors import HcclError
    if not isinstance(e, HcclError) and isinstance(cause, HcclError):
        return cause
    return e
