"""torch.npu.Stream and torch.npu.Event over npusim's runtime streams and events."""
from __future__ import annotations

import contextlib
import weakref

import torch

import runtime
from runtime.torch import device as _device

_wrappers = weakref.WeakValueDictionary()     # runtime stream id -> its torch.npu.Stream


class Stream:
    """An npusim stream of one simulated NPU (torch_npu.npu.Stream)."""

    def __new__(cls, device=None, priority: int = 0, *, _rt=None):
        if _rt is not None:
            w = _wrappers.get(_rt.id)
            if w is not None:
                return w
        self = super().__new__(cls)
        if _rt is None:
            d = _device.check_index(device)
            with _device.on(d):
                _rt = runtime.Stream(priority=priority)
        self.npu_stream = _rt
        self.device_index = _rt.device_id
        self.priority = priority
        _wrappers[_rt.id] = self
        return self

    def __init__(self, device=None, priority: int = 0, **_):
        pass

    @property
    def device(self) -> torch.device:
        return torch.device("npu", self.device_index)

    def synchronize(self) -> None:
        self.npu_stream.synchronize()

    def query(self) -> bool:
        return self.npu_stream.query()

    def wait_event(self, event: "Event") -> None:
        self.npu_stream.wait_event(event.npu_event)

    def wait_stream(self, stream: "Stream") -> None:
        self.npu_stream.wait_stream(_rt_stream(stream))

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.npu_stream is self.npu_stream

    def __hash__(self):
        return hash(self.npu_stream.id)

    def __repr__(self):
        return f"<torch_npu.npu.Stream device=npu:{self.device_index} {self.npu_stream.name}>"


def _rt_stream(s):
    if isinstance(s, Stream):
        return s.npu_stream
    if isinstance(s, runtime.Stream):
        return s
    raise TypeError(f"expected a torch.npu.Stream, got {type(s).__name__}")


class Event:
    """An npusim event (torch_npu.npu.Event)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.npu_event = runtime.Event(enable_timing=enable_timing)

    def record(self, stream: Stream | None = None) -> None:
        s = current_stream() if stream is None else stream
        with _device.on(s.device_index):
            self.npu_event.record(_rt_stream(s))

    def wait(self, stream: Stream | None = None) -> None:
        s = current_stream() if stream is None else stream
        _rt_stream(s).wait_event(self.npu_event)

    def query(self) -> bool:
        return self.npu_event.query()

    def synchronize(self) -> None:
        self.npu_event.synchronize()

    def elapsed_time(self, end_event: "Event") -> float:
        return self.npu_event.elapsed_time(end_event.npu_event)

    def __repr__(self):
        return f"<torch_npu.npu.Event {self.npu_event!r}>"


def current_stream(device=None) -> Stream:
    d = _device.check_index(device)
    with _device.on(d):
        return Stream(_rt=runtime.current_stream())


def default_stream(device=None) -> Stream:
    d = _device.check_index(device)
    with _device.on(d):
        return Stream(_rt=runtime.default_stream())


def set_stream(stream: Stream) -> None:
    raise NotImplementedError("torch.npu.set_stream: use the torch.npu.stream(s) context manager")


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make ``s`` the current stream of its device for the block (``None``: no change)."""
    if s is None:
        yield
        return
    with _device.on(s.device_index):
        with runtime.stream(s.npu_stream):
            yield
