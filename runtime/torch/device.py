"""Which simulated NPU an ``npu`` tensor operation runs on, and switching to it.

torch names devices ``npu:N``; npusim binds a thread to device N with ``runtime.set_device``.
An operation on tensors of ``npu:N`` runs on device N's current stream; when the thread's current
device is another one, it is switched for the operation and switched back (torch_npu's device
guard does the same). A thread that never chose a device takes ``LOCAL_RANK`` (or 0), as
``runtime.set_device()`` does.
"""
from __future__ import annotations

import contextlib

import torch

import runtime
from runtime.errors import ContextError


def current() -> int:
    """The calling thread's device, choosing the default one (LOCAL_RANK or 0) on first use."""
    try:
        return runtime.get_device()
    except ContextError:
        runtime.set_device()
        return runtime.get_device()


_count: list = []        # NPUSIM_DEVICE_COUNT, read once: it is fixed for the process


def check_index(index, what: str = "device") -> int:
    """``index`` as a valid device index; torch's RuntimeError with npusim's numbers if not."""
    if index is None:
        return current()
    if not _count:
        _count.append(runtime.device_count())
    n = _count[0]
    if isinstance(index, torch.device):
        if index.type != "npu":
            raise ValueError(f"{what}={index}: expected an npu device")
        return current() if index.index is None else check_index(index.index, what)
    if isinstance(index, str):
        return check_index(torch.device(index), what)
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{what}={index!r}: expected an int, a torch.device or a string like 'npu:0'")
    if not 0 <= index < n:
        raise RuntimeError(f"Invalid device ordinal: {what}={index} but there are {n} npu devices "
                           f"(valid 0..{n - 1}; NPUSIM_DEVICE_COUNT={n})")
    return index


@contextlib.contextmanager
def on(index: int):
    """Make ``index`` the calling thread's runtime device for the block (restored after)."""
    prev = current()
    if prev == index:
        yield
        return
    runtime.set_device(index)
    try:
        yield
    finally:
        runtime.set_device(prev)
