"""What the calling thread works on now: its device's context and its current stream.

The bottom of runtime's core: ``context`` (which makes the contexts and binds devices), ``stream``
(a ``Stream()`` made without a context takes the current one) and ``event`` (``record`` on the
current stream) all read this state, and this module imports none of them. ``StreamBase`` is
what a stream is to them (``stream.Stream`` is the one kind), so ``resolve_stream`` checks its
argument without importing ``stream``. The public names are also ``runtime.context``'s.
"""
from __future__ import annotations

import threading

from .errors import ContextError, InvalidParamError

contexts_by_device: dict = {}       # device id -> its Context in this process
process_device: int | None = None   # the device of threads that never called set_device


class ThreadState(threading.local):
    """Per-thread device and stream stacks; class defaults make a missing value cheap to read
    (``getattr(local, name, None)`` on a missing name raises and catches internally: ~1.5 us)."""
    device: int | None = None
    streams: dict | None = None


thread = ThreadState()


class StreamBase:
    """What every stream is to the core below ``stream``: ``runtime.Stream`` derives from it."""

    __slots__ = ()


def current_context():
    """The calling thread's context (its ``set_device``'s, else the process's device's).

    Raises ContextError when no device is set."""
    dev = thread.device
    if dev is None:
        dev = process_device
    ctx = contexts_by_device.get(dev) if dev is not None else None
    if ctx is None:
        raise ContextError(
            "no NPU device is set for this thread: call runtime.set_device() first (without an "
            "argument it takes LOCAL_RANK under a launcher, else device 0)")
    return ctx


def current_context_and_stream():
    """``current_context()`` and its current stream, reading the thread state once (malloc's
    path: each read of a ``threading.local`` costs ~0.1 us here)."""
    t = thread
    dev = t.device
    if dev is None:
        dev = process_device
    ctx = contexts_by_device.get(dev) if dev is not None else None
    if ctx is None:
        return current_context(), None          # raises ContextError
    stacks = t.streams
    st = stacks.get(dev) if stacks else None
    return ctx, (st[-1] if st else ctx.default_stream)


def stream_stack(device_id: int) -> list:
    """The calling thread's stack of current streams on device ``device_id`` (``with
    stream(s):`` pushes; the top is the current stream)."""
    stacks = thread.streams
    if stacks is None:
        stacks = thread.streams = {}
    return stacks.setdefault(device_id, [])


def set_current_stream(s) -> None:
    """Make ``s`` the calling thread's current stream on its device until the innermost
    ``with stream(...)`` block around the call ends (torch's ``set_stream``); outside any
    block, until the next call."""
    if not isinstance(s, StreamBase):
        raise InvalidParamError(f"set_current_stream({s!r}): expected a runtime.Stream")
    st = stream_stack(s.device_id)
    if st:
        st[-1] = s
    else:
        st.append(s)


def current_stream():
    """The stream made current by the innermost ``with stream(s):`` (else the default stream).

    ``current_stream_of(current_context())`` with the thread state read once (the operator
    path asks it about once per operator): ``current_context_and_stream``'s."""
    return current_context_and_stream()[1]


def current_stream_of(ctx):
    """The calling thread's current stream on ``ctx``'s device."""
    stacks = thread.streams
    st = stacks.get(ctx.device_id) if stacks else None
    return st[-1] if st else ctx.default_stream


def resolve_stream(s):
    """``s`` itself, or the current stream when ``s`` is None (validates the type)."""
    if s is None:
        return current_stream()
    if not isinstance(s, StreamBase):
        raise InvalidParamError(f"stream={s!r}: expected a runtime.Stream or None")
    if s._destroyed:
        raise InvalidParamError(f"{s.name} was destroyed; create a new Stream")
    return s
