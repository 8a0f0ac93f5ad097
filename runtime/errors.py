"""Exceptions of the simulated NPU runtime.

Every error carries an ACL-style ``code`` (the aclError value a pyACL user would see) and a
message that says what happened, with numbers, and what to do. All classes pickle cleanly so they
can cross process boundaries (launcher.spawn, error files).
"""
from __future__ import annotations

# ACL error codes (acl_base.h)
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_STREAM_CONTEXT = 107003
ACL_ERROR_RT_INVALID_MEMORY_TYPE = 107013
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047
ACL_ERROR_RT_AICORE_EXCEPTION = 507015
ACL_ERROR_RT_INTERNAL_ERROR = 507899
ACL_ERROR_RT_DEVICE_TASK_ABORT = 507056
# npusim's own, next to the runtime's internal-error code: ACL has no stream-race error
ACL_ERROR_RT_STREAM_RACE = 507900


class NpuError(RuntimeError):
    """Base class of every runtime error; ``code`` is the ACL error code."""

    code = ACL_ERROR_RT_INTERNAL_ERROR

    def __init__(self, message: str = "", code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.code, dict(self.__dict__)))

    def __str__(self):
        return super().__str__()


def _rebuild(cls, message, code, state):
    err = cls.__new__(cls)
    RuntimeError.__init__(err, message)
    err.__dict__.update(state)
    err.code = code
    return err


class InvalidParamError(NpuError, ValueError):
    """A bad argument at the call (code 107000); nothing was changed."""

    code = ACL_ERROR_RT_PARAM_INVALID


class ContextError(NpuError):
    """The runtime was used before ``set_device`` or after ``reset_device`` (code 107002)."""

    code = ACL_ERROR_RT_CONTEXT_NULL


class MemoryAccessError(NpuError, ValueError):
    """Use after free, double free, a pointer outside any live block, or a copy overrun."""

    code = ACL_ERROR_RT_PARAM_INVALID


class OutOfMemoryError(NpuError, MemoryError):
    """The caching pool could not find or reserve memory (code 207001)."""

    code = ACL_ERROR_RT_MEMORY_ALLOCATION


class SyncTimeoutError(NpuError, TimeoutError):
    """A synchronize ran out of time (code 507046); the work goes on, nothing changed."""

    code = ACL_ERROR_RT_STREAM_SYNC_TIMEOUT


class GraphCaptureError(NpuError):
    """A call that a task graph cannot capture, or a graph used wrongly (code 207000,
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT); the capture and the streams stay usable."""

    code = 207000


class TaskError(NpuError):
    """A task on a stream raised; chained to the original exception (code 507015).

    Fields: ``task`` (its name), ``site`` (file:line that enqueued it), ``stream`` (stream name).
    """

    code = ACL_ERROR_RT_AICORE_EXCEPTION

    def __init__(self, message: str = "", task: str = "", site: str = "", stream: str = ""):
        super().__init__(message)
        self.task = task
        self.site = site
        self.stream = stream


class StreamRaceError(NpuError):
    """The stream sanitizer found two unordered accesses to the same bytes (code 507900).

    Raised at the second enqueue, before it is queued (``NPUSIM_STREAM_CHECK``, docs/runtime.md).
    Fields: ``address``, ``nbytes`` (the bytes both touch), ``alloc_base``, ``alloc_size``,
    ``alloc_site`` (the allocation), and for each task ``first_*`` / ``second_*``: ``task``,
    ``stream``, ``site`` (file:line that enqueued it), ``access`` ("read", "write", "free").
    """

    code = ACL_ERROR_RT_STREAM_RACE

    def __init__(self, message: str = "", **fields):
        super().__init__(message)
        self.__dict__.update(fields)


_combined: dict[type, type] = {}


def _rebuild_combined(orig_cls, message, state):
    cls = task_error_class(orig_cls)
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


def task_error_class(orig_cls: type) -> type:
    """``TaskError`` for a task exception; keeps the exception's own type when it asks to.

    A library whose errors users catch by type (hccl's HcclTimeoutError, ...) marks its classes
    with ``npusim_surface = True``; a failing task of such a type then surfaces as a class that is
    both a ``TaskError`` and the original type, so ``except TaskError`` and
    ``except HcclTimeoutError`` both work.
    """
    if not getattr(orig_cls, "npusim_surface", False):
        return TaskError
    cls = _combined.get(orig_cls)
    if cls is None:
        def __reduce__(self):
            return (_rebuild_combined, (orig_cls, str(self), dict(self.__dict__)))

        def __str__(self):
            return Exception.__str__(self)
        # the original type first, so its __new__ (and its C layout, e.g. OSError's) is used
        cls = type(f"TaskError[{orig_cls.__name__}]", (orig_cls, TaskError),
                   {"__reduce__": __reduce__, "__str__": __str__, "__module__": __name__})
        _combined[orig_cls] = cls
    return cls


def describe(value, limit: int = 80) -> str:
    """How an error message shows a value, on one line: an array by its type, shape and dtype
    (its repr spans lines, shows contents and says nothing of what was wrong), a bytes-like
    object by its length, anything else by its repr, cut at ``limit`` characters."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        kind = type(value)
        return f"{kind.__module__}.{kind.__qualname__}(shape={tuple(shape)}, dtype={dtype})"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{type(value).__name__} of {len(value)} bytes"
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
