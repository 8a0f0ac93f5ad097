"""Kernels and host callbacks in stream order (aclrtLaunchKernel / aclrtLaunchCallback)."""
from __future__ import annotations

from .array import DeviceArray
from .callsite import callsite
from .context import resolve_stream
from .errors import InvalidParamError


def launch(kernel, *args, stream=None, name: str | None = None) -> None:
    """Enqueue ``kernel(*args)`` on ``stream``; DeviceArray arguments arrive as numpy views.

    Returns at once. An exception in the kernel is raised by the next synchronize as TaskError.
    """
    if not callable(kernel):
        raise InvalidParamError(f"launch(kernel={kernel!r}): kernel must be callable")
    s = resolve_stream(stream)
    for i, a in enumerate(args):
        if isinstance(a, DeviceArray) and a._freed:
            raise InvalidParamError(f"launch: argument {i} is a freed DeviceArray (allocated at {a._site})")
    if any(isinstance(a, DeviceArray) for a in args):
        def task():
            kernel(*[a._np() if isinstance(a, DeviceArray) else a for a in args])
    else:
        def task():
            kernel(*args)
    s.enqueue(task, name or getattr(kernel, "__name__", "kernel"), "kernel", None, callsite(2))


def launch_callback(fn, stream=None) -> None:
    """Enqueue host callback ``fn()`` in stream order."""
    if not callable(fn):
        raise InvalidParamError(f"launch_callback(fn={fn!r}): fn must be callable")
    s = resolve_stream(stream)
    s.enqueue(fn, getattr(fn, "__name__", "callback"), "callback", None, callsite(2))
