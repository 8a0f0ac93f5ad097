"""Kernels and host callbacks in stream order (aclrtLaunchKernel / aclrtLaunchCallback).

What a task touches, for the stream sanitizer (runtime/sanitizer.py): a kernel writes its
DeviceArray / DevicePtr arguments (a DevicePtr to the end of its allocation) unless an argument
is wrapped in ``read_only``; ``reads=`` / ``writes=`` name buffers a kernel or a callback reaches
otherwise (a closure's arrays). Without the check these cost nothing but the unwrapping.
"""
from __future__ import annotations

from . import hooks
from .array import DeviceArray
from .callsite import callsite
from .context import resolve_stream
from .errors import InvalidParamError
from .memory import DevicePtr, host_view

_BUFFERS = (DeviceArray, DevicePtr)


class ReadOnly:
    """A kernel argument the kernel only reads: ``runtime.launch(k, out, runtime.read_only(x))``.

    A DeviceArray arrives in the kernel as a read-only numpy view (a write raises there); a
    DevicePtr arrives as itself.
    """

    __slots__ = ("buf",)

    def __init__(self, buf):
        if not isinstance(buf, _BUFFERS):
            raise InvalidParamError(f"read_only(buf={buf!r}): expected a DeviceArray or DevicePtr")
        self.buf = buf

    def __repr__(self):
        return f"read_only({self.buf!r})"


def read_only(buf) -> ReadOnly:
    """Declare a kernel argument read-only (see ``ReadOnly``)."""
    return ReadOnly(buf)


def _arg(a):
    if isinstance(a, DeviceArray):
        return a._np()
    if type(a) is ReadOnly:
        if isinstance(a.buf, DeviceArray):
            v = a.buf._np()
            v.flags.writeable = False
            return v
        return a.buf
    return a


def _check_bufs(bufs, what: str, fn: str) -> None:
    if isinstance(bufs, _BUFFERS) or not isinstance(bufs, (list, tuple)):
        raise InvalidParamError(f"{fn}: {what}={bufs!r} must be a list or tuple of DeviceArray / "
                                "DevicePtr")
    for i, b in enumerate(bufs):
        if not isinstance(b, _BUFFERS):
            raise InvalidParamError(f"{fn}: {what}[{i}]={b!r} is not a DeviceArray or DevicePtr")


def launch(kernel, *args, stream=None, name: str | None = None, reads=(), writes=()) -> None:
    """Enqueue ``kernel(*args)`` on ``stream``; DeviceArray arguments arrive as numpy views.

    Returns at once. An exception in the kernel is raised by the next synchronize as TaskError.
    ``read_only(x)`` arguments and the ``reads`` / ``writes`` lists tell the stream sanitizer what
    the kernel touches (every other device argument counts as written).
    """
    if not callable(kernel):
        raise InvalidParamError(f"launch(kernel={kernel!r}): kernel must be callable")
    s = resolve_stream(stream)
    dev = False
    for i, a in enumerate(args):
        if type(a) is ReadOnly:
            dev, a = True, a.buf
        if isinstance(a, DeviceArray):
            if a.freed:
                raise InvalidParamError(f"launch: argument {i} is a freed DeviceArray (allocated at {a._site})")
            dev = True
            a = a.ptr
        if type(a) is DevicePtr and a._block.gen != a._gen:   # a view's owner, or a pointer,
            host_view(a, 0, name=f"launch: argument {i}")     # freed: raises use after free
    if reads or writes:
        _check_bufs(reads, "reads", "launch")
        _check_bufs(writes, "writes", "launch")
    name = name or getattr(kernel, "__name__", "kernel")
    site = callsite(2)
    chk = hooks.stream_check
    if chk is not None:
        chk.access(s, name, site, [a.buf for a in args if type(a) is ReadOnly] + list(reads),
                   [a for a in args if isinstance(a, _BUFFERS)] + list(writes))
    if dev:
        def task():
            kernel(*[_arg(a) for a in args])
    else:
        def task():
            kernel(*args)
    s.enqueue(task, name, "kernel", None, site)


def launch_callback(fn, stream=None, *, reads=(), writes=()) -> None:
    """Enqueue host callback ``fn()`` in stream order; ``reads`` / ``writes`` name the device
    buffers it touches, for the stream sanitizer."""
    if not callable(fn):
        raise InvalidParamError(f"launch_callback(fn={fn!r}): fn must be callable")
    s = resolve_stream(stream)
    if reads or writes:
        _check_bufs(reads, "reads", "launch_callback")
        _check_bufs(writes, "writes", "launch_callback")
    name = getattr(fn, "__name__", "callback")
    site = callsite(2)
    chk = hooks.stream_check
    if chk is not None:
        chk.access(s, name, site, reads, writes)
    s.enqueue(fn, name, "callback", None, site)
