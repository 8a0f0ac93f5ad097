"""torch.npu.Stream and torch.npu.Event over npusim's runtime streams and events.

They are a ``torch.Stream`` and a ``torch.Event`` (as ``torch.cuda.Stream`` and
``torch.cuda.Event`` are), so torch takes them wherever it takes one: ``Tensor.record_stream``
(ZeRO-3), ``isinstance(s, torch.Stream)``, ``torch.Stream`` equality and hashing. A stream is
named to torch as (``stream_id``, ``device_index``, ``device_type`` = npu): ``stream_id`` 0 is a
device's default stream (what torch's own ``torch.accelerator.current_stream()`` answers, from
torch's Python device guard, which knows no other stream), any other is the npusim stream's id.
``rt_stream`` maps any of them back to the npusim stream. The methods (synchronize, query,
wait_event, wait_stream, record_event; record, wait, elapsed_time) are npusim's; the base
classes' C++ methods would ask torch's Python device guard, whose stream and event calls do
nothing (torch/csrc/acc/Module.cpp).
"""
from __future__ import annotations

import contextlib
import weakref

import torch

import runtime
from runtime.torch import device as _device

_wrappers = weakref.WeakValueDictionary()     # runtime stream id -> its torch.npu.Stream
_defaults: dict = {}      # device -> its default stream's wrapper, kept alive: current_stream()
                          # on the default stream (what libraries ask per step) then makes none
_NPU_TYPE = 20                                # c10::DeviceType::PrivateUse1


def _is_default(rt) -> bool:
    with _device.on(rt.device_id):
        return runtime.default_stream() is rt


class Stream(torch.Stream):
    """An npusim stream of one simulated NPU (torch_npu.npu.Stream); a ``torch.Stream``."""

    def __new__(cls, device=None, priority: int = 0, *, _rt=None, **kwargs):
        if _rt is None and "stream_id" in kwargs:   # torch's way to name a stream
            _rt = rt_stream(torch.Stream(stream_id=kwargs["stream_id"],
                                         device_index=kwargs.get("device_index", 0),
                                         device_type=kwargs.get("device_type", _NPU_TYPE)))
        if _rt is not None:
            w = _wrappers.get(_rt.id)
            if w is not None:
                return w
        if _rt is None:
            d = _device.check_index(device)
            with _device.on(d):
                _rt = runtime.Stream(priority=priority)
        sid = 0 if _is_default(_rt) else _rt.id
        self = super().__new__(cls, stream_id=sid, device_index=_rt.device_id,
                               device_type=_NPU_TYPE)
        self.npu_stream = _rt
        self.priority = priority
        _wrappers[_rt.id] = self
        if sid == 0:          # one per device: a reset device's new default replaces it
            _defaults[_rt.device_id] = self
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
        self.npu_stream.wait_event(_rt_event(event))

    def wait_stream(self, stream) -> None:
        self.npu_stream.wait_stream(rt_stream(stream))

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        if not isinstance(event, Event):
            raise TypeError(f"record_event(event={event!r}): expected a torch.npu.Event")
        event.record(self)
        return event

    def is_capturing(self) -> bool:
        return False

    def __enter__(self):
        self._ctx = stream(self)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        ctx, self._ctx = self._ctx, None
        return ctx.__exit__(*exc)

    def __eq__(self, other):
        if isinstance(other, Stream):
            return other.npu_stream is self.npu_stream
        return isinstance(other, torch.Stream) and super().__eq__(other)

    def __hash__(self):
        return super().__hash__()

    def __repr__(self):
        return (f"<torch_npu.npu.Stream device=npu:{self.device_index} "
                f"stream_id={self.stream_id} {self.npu_stream.name}>")


def rt_stream(s):
    """The npusim stream of a torch.npu.Stream, of a ``torch.Stream`` naming an npu stream
    (stream_id 0: the default stream; index 0 or None: the thread's NPU, see
    runtime/torch/device.py), or of a runtime.Stream."""
    if isinstance(s, Stream):
        return s.npu_stream
    if isinstance(s, runtime.Stream):
        return s
    if isinstance(s, torch.Stream):
        if s.device_type != _NPU_TYPE:
            raise TypeError(f"expected an npu stream, got {s!r}")
        if s.stream_id == 0:
            with _device.on(_device.target(s.device_index)):
                return runtime.default_stream()
        w = _wrappers.get(s.stream_id)
        if w is None:
            raise ValueError(f"{s!r}: no live torch.npu.Stream has stream_id {s.stream_id}")
        return w.npu_stream
    raise TypeError(f"expected a torch.npu.Stream, got {type(s).__name__}")


_rt_stream = rt_stream


def _rt_event(e):
    if isinstance(e, Event):
        return e.npu_event
    raise TypeError(f"expected a torch.npu.Event, got {type(e).__name__}")


class Event(torch.Event):
    """An npusim event (torch_npu.npu.Event); a ``torch.Event``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False):
        self = super().__new__(cls, device="npu", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)
        self.enable_timing = enable_timing
        self.npu_event = runtime.Event(enable_timing=enable_timing)
        return self

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        pass

    def record(self, stream=None) -> None:
        s = current_stream() if stream is None else stream
        rt = rt_stream(s)
        with _device.on(rt.device_id):
            self.npu_event.record(rt)

    def wait(self, stream=None) -> None:
        s = current_stream() if stream is None else stream
        rt_stream(s).wait_event(self.npu_event)

    def query(self) -> bool:
        return self.npu_event.query()

    def synchronize(self) -> None:
        self.npu_event.synchronize()

    def elapsed_time(self, end_event: "Event") -> float:
        return self.npu_event.elapsed_time(_rt_event(end_event))

    def __repr__(self):
        return f"<torch_npu.npu.Event {self.npu_event!r}>"


def _of(rt) -> Stream:
    """The torch.npu.Stream of runtime stream ``rt`` (its wrapper when one is alive)."""
    w = _wrappers.get(rt.id)
    return w if w is not None else Stream(_rt=rt)


def current_stream(device=None) -> Stream:
    """The current stream of ``device`` (the current device by default); on the current device
    without a device switch or a new wrapper (0.5 us instead of 5.6)."""
    d = _device.check_index(device)
    if d == _device.current():
        return _of(runtime.current_stream())
    with _device.on(d):
        return _of(runtime.current_stream())


def default_stream(device=None) -> Stream:
    d = _device.check_index(device)
    if d == _device.current():
        return _of(runtime.default_stream())
    with _device.on(d):
        return _of(runtime.default_stream())


def set_stream(stream: Stream) -> None:
    raise NotImplementedError("torch.npu.set_stream: use the torch.npu.stream(s) context manager")


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make ``s`` the current stream of its device for the block (``None``: no change)."""
    if s is None:
        yield
        return
    rt = rt_stream(s)
    with _device.on(rt.device_id):
        with runtime.stream(rt):
            yield
