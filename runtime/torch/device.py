"""Which simulated NPU an ``npu`` tensor operation runs on, and switching to it.

torch names devices ``npu:N``; npusim binds a thread to device N with ``runtime.set_device``.
An operation on tensors of ``npu:N`` runs on device N's current stream; when the thread's current
device is another one, it is switched for the operation and switched back (torch_npu's device
guard does the same). A thread that never chose a device takes ``LOCAL_RANK`` (or 0), as
``runtime.set_device()`` does.

Design note: device indices (docs/torch.md, "Device indices"). torch 2.13's Python device guard
(torch/csrc/acc/Module.cpp) answers a device count of 1 and a current device of 0 whatever
Python says. Two consequences, and what npusim does about each:

- torch fills a missing index from the guard: ``t.to("npu")`` and ``module.to("npu")`` reach the
  kernels as ``npu:0`` on every thread, so "0" cannot mean simulated NPU 0 when a process bound
  itself to another one. A *placement* (``target``: the device a new npu tensor is made on, from
  a factory, ``.to``, ``torch.load``) therefore reads index 0, or none, as the thread's current
  NPU (``torch.npu.set_device``), and N > 0 as NPU N: a rank that called ``set_device(local_rank)``
  gets its own NPU from ``"npu"``, ``"npu:0"`` and ``f"npu:{local_rank}"`` alike, as on a cluster
  where ASCEND_RT_VISIBLE_DEVICES shows each process its own NPU as 0. A tensor's ``device`` is
  the NPU that holds its bytes (``npu:1`` on rank 1). The torch.npu functions take their index
  literally (``check_index``).
- torch's autograd engine sizes its per-device worker queues by the guard's count and asserts on a
  backward of a tensor on ``npu:N``, N > 0. A thread that uses an npu device (``set_device``, or
  its first npu allocation: ``bind_thread``) therefore runs its backward passes itself
  (``torch.autograd.set_multithreading_enabled(False)``, thread-local, public): the engine then
  never looks up a device queue. CPU backward already runs on the calling thread, so only where
  npu backward runs changes: on the thread that calls ``backward()``, on its current stream.
"""
from __future__ import annotations

import contextlib
import threading

import torch

import runtime
from runtime import current as _current
from runtime.errors import ContextError


_thread = _current.thread                   # runtime's per-thread state
_contexts = _current.contexts_by_device     # device id -> Context (mutated, never rebound)


def current() -> int:
    """The calling thread's device, choosing the default one (LOCAL_RANK or 0) on first use.

    ``runtime.get_device()``'s answer, read inline (0.08 us instead of 0.16: the operator path
    asks it about once per operator): the thread's device, else the process's, while its
    context exists; otherwise (none yet, or a ``reset_device`` removed it) the full path."""
    dev = _thread.device
    if dev is None:
        dev = _current.process_device
    if dev in _contexts:
        return dev
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


def target(device) -> int:
    """The simulated NPU a new tensor placed on torch device ``device`` goes to (see the note):
    index None or 0 is the calling thread's current NPU, N > 0 is NPU N (checked)."""
    if device is None:
        return current()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        index = device.index
        if device.type != "npu":
            raise ValueError(f"device={device}: expected an npu device")
    else:
        index = device
    if not index:
        return current()
    return check_index(index)


_bound = threading.local()


def bind_thread() -> None:
    """Run this thread's backward passes on itself (see the note); once per thread."""
    if not getattr(_bound, "done", False):
        torch.autograd.set_multithreading_enabled(False)
        _bound.done = True


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
