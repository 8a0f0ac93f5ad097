"""torch.npu.utils (torch_npu.npu.utils): devices, stream selection, overflow checks, versions.

The device and stream functions here are torch.npu's own (``torch.npu.set_device`` is this
module's). What a simulated Ascend 910B1 answers where torch_npu asks CANN: it supports inf/nan
arithmetic (``is_support_inf_nan``), so overflow is checked on values (``npu_check_overflow``)
and the float-status register API raises as torch_npu's does on a 910B; ``get_cann_version``
is the CANN version npusim reports (``torch.version.cann``). Options with no effect here
(``set_task_queue_enable``, ``set_sync_debug_mode``, ``set_op_timeout_ms``) are checked as
torch_npu checks them, recorded, and read back. Names tied to CANN tooling (dump, stress
detection, obfuscation, BLAS handles) raise ``NotSupportedError`` saying why.
"""
from __future__ import annotations

import os
import warnings

import torch

import runtime
from runtime.torch import device as _device

from . import options as _options
from .streams import Stream, current_stream, default_stream  # noqa: F401
from .streams import stream as _stream_cm

__all__ = ["obfuscation_initialize", "obfuscation_finalize", "obfuscation_calculate",
           "synchronize", "set_device", "current_device", "device", "device_of", "StreamContext",
           "stream", "set_stream", "current_stream", "default_stream", "set_sync_debug_mode",
           "get_sync_debug_mode", "init_dump", "set_dump", "finalize_dump", "is_support_inf_nan",
           "is_force_overflow_check", "is_bf16_supported", "get_npu_overflow_flag",
           "npu_check_overflow", "clear_npu_overflow_flag", "current_blas_handle",
           "check_uce_in_memory", "stress_detect", "get_cann_version", "ipc_collect",
           "set_op_timeout_ms", "set_task_queue_enable", "get_task_queue_enable"]

CANN_VERSION = "9.0.0"          # the CANN release npusim answers for (torch.version.cann): the
                                # newest that torch_npu 2.14.0 tests for below 9.1.0


class NotSupportedError(NotImplementedError):
    """A torch_npu name that has no meaning on npusim's simulated NPUs (the message says why)."""


def not_supported(name: str, why: str, module: str = "torch.npu"):
    """A function named ``name`` that raises NotSupportedError: ``<module>.<name>`` ... ``why``."""
    def fn(*args, **kwargs):
        raise NotSupportedError(f"{module}.{name} is not supported by npusim: {why}")
    fn.__name__ = fn.__qualname__ = name.rsplit(".", 1)[-1]
    fn.__doc__ = f"Not supported by npusim: {why}"
    fn._npusim_not_supported = True
    return fn


def unsupported_class(name: str, why: str, module: str = "torch.npu"):
    """A class named ``name`` whose construction raises NotSupportedError (``why``)."""
    def __init__(self, *args, **kwargs):
        raise NotSupportedError(f"{module}.{name} is not supported by npusim: {why}")
    return type(name, (), {"__init__": __init__, "__module__": module,
                           "_npusim_not_supported": True,
                           "__doc__": f"Not supported by npusim: {why}"})


def synchronize(device=None) -> None:
    """Wait for every stream of ``device`` (the current one by default)."""
    if device is None:          # the current device: no switch to make and undo
        _device.current()       # (chooses the default device on first use)
        runtime.synchronize()
        return
    d = _device.check_index(device)
    with _device.on(d):
        runtime.synchronize()


def set_device(device) -> None:
    """Bind the calling thread to simulated NPU ``device`` (int, 'npu:N' or torch.device); the
    thread then runs its backward passes itself (runtime/torch/device.py, the note). A negative
    int is ignored, as torch_npu ignores it."""
    if isinstance(device, int) and not isinstance(device, bool) and device < 0:
        return
    runtime.set_device(_device.check_index(device))
    _device.bind_thread()


def current_device() -> int:
    return _device.current()


class device:
    """``with torch.npu.device(i):`` makes ``i`` the current device for the block (no change for
    None or a negative index, as torch_npu)."""

    def __init__(self, device):
        if device is None or (isinstance(device, int) and not isinstance(device, bool)
                              and device < 0):
            self.idx = -1
        else:
            self.idx = _device.check_index(device)
        self.prev = None

    def __enter__(self):
        if self.idx < 0:
            return self
        self.prev = _device.current()
        runtime.set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            runtime.set_device(self.prev)
        return False


class device_of(device):
    """``with torch.npu.device_of(t):``: the device of npu tensor ``t`` (no change otherwise)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if getattr(obj, "is_npu", False) else -1)


class StreamContext:
    """``with torch.npu.StreamContext(s):`` makes ``s`` current for the block (None: no change)."""

    def __init__(self, stream_ctx):
        self.stream = stream_ctx
        self._cm = None

    def __enter__(self):
        self._cm = _stream_cm(self.stream)
        self._cm.__enter__()
        return self.stream

    def __exit__(self, *exc):
        cm, self._cm = self._cm, None
        return cm.__exit__(*exc) if cm is not None else False


def stream(stream) -> StreamContext:
    """``with torch.npu.stream(s):`` (torch_npu's StreamContext)."""
    return StreamContext(stream)


def set_stream(stream) -> None:
    """Make ``stream`` the calling thread's current stream on its device, until the next
    ``set_stream`` (inside a ``with torch.npu.stream(...)`` block: until the block ends).
    None does nothing, as torch's."""
    if stream is None:
        return
    from runtime.context import set_current_stream
    from .streams import _rt_stream
    set_current_stream(_rt_stream(stream))


_SYNC_DEBUG = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode) -> None:
    """Record the sync debug mode ("default"/0, "warn"/1, "error"/2). npusim does not warn on
    synchronizing operations: the mode is read back by ``get_sync_debug_mode`` only."""
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, "
                               f"`error`, got {debug_mode!r}")
        debug_mode = _SYNC_DEBUG[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode {debug_mode!r}: expected 0, 1 or 2")
    _options.set_option({"SYNC_DEBUG_MODE": str(debug_mode)})


def get_sync_debug_mode() -> int:
    return int(_options.get_option("SYNC_DEBUG_MODE") or 0)


def set_task_queue_enable(mode) -> None:
    """Record the task queue level (0, 1 or 2; torch_npu's TASK_QUEUE_ENABLE). npusim's streams
    always queue (docs/torch.md, "Streams")."""
    mode = int(mode) if isinstance(mode, str) else mode
    if mode not in (0, 1, 2):
        raise RuntimeError(f"mode must be 0, 1, or 2, but got {mode}.")
    _options.set_option({"TASK_QUEUE_ENABLE": str(mode)})


def get_task_queue_enable() -> int:
    """The level set by ``set_task_queue_enable``, else TASK_QUEUE_ENABLE (default 1)."""
    v = _options.get_option("TASK_QUEUE_ENABLE") or os.environ.get("TASK_QUEUE_ENABLE", "1")
    return int(v)


def set_op_timeout_ms(timeout_ms) -> None:
    """Record the operator timeout (no effect: npusim's tasks are not timed out per operator)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
        raise ValueError(f"set_op_timeout_ms: timeout_ms must be an int >= 0, got {timeout_ms!r}")
    _options.set_option({"OP_TIMEOUT_MS": str(timeout_ms)})


def is_support_inf_nan() -> bool:
    """True: the simulated Ascend 910B1 computes with inf and nan (IEEE), as a 910B does."""
    return True


def is_force_overflow_check() -> bool:
    """False: torch_npu honours FORCE_OVERFLOW_CHECK=1 from CANN 9.1.0 on (CANN_VERSION is
    older)."""
    return False


def is_bf16_supported(including_emulation: bool = False) -> bool:
    return True


def get_npu_overflow_flag():
    raise RuntimeError("Unsupported api when soc_version >= Ascend910B1, please use "
                       "npu_check_overflow (npusim simulates an Ascend910B1)")


def npu_check_overflow(grad) -> bool:
    """True when ``grad`` (a float or tensor) sums to inf or nan, as torch_npu on a 910B."""
    if isinstance(grad, float):
        s = grad
    elif isinstance(grad, torch.Tensor):
        s = float(grad.float().sum())
    else:
        raise RuntimeError(f"npu_check_overflow: unsupported type {type(grad).__name__} "
                           "(a float or a torch.Tensor)")
    return s in (float("inf"), -float("inf")) or s != s


def clear_npu_overflow_flag() -> None:
    warnings.warn("When soc_version >= Ascend910B1, clear_npu_overflow_flag is useless. "
                  "Please remove it.")


def check_uce_in_memory(device_id) -> int:
    """0: no uncorrectable memory error (simulated memory has none)."""
    _device.check_index(device_id, "device_id")
    return 0


def _is_gte_cann_version(version: str, module: str = "CANN") -> bool:
    """True when CANN_VERSION >= ``version`` (torch_npu's "8.5.0", "8.2.RC1", "8.5.0.alpha003")."""
    return _cann_key(get_cann_version(module)) >= _cann_key(version)


def _cann_key(v: str) -> tuple:
    import re
    m = re.match(r"^(\d+)\.(\d+)\.(\d+|RC(\d+))(?:\.(alpha|beta)(\d+))?", str(v))
    if not m:
        raise ValueError(f"not a CANN version: {v!r} (like '8.5.0' or '8.2.RC1')")
    major, minor, patch = int(m.group(1)), int(m.group(2)), m.group(3)
    # an RC precedes the .0 release of its minor; alpha/beta precede the release they name
    p = (-1, int(m.group(4))) if patch.startswith("RC") else (int(patch), 0)
    pre = {"alpha": 0, "beta": 1}.get(m.group(5), 2), int(m.group(6) or 0)
    return (major, minor) + p + pre


def get_cann_version(module: str = "CANN") -> str:
    """The CANN version npusim answers for (every module reports the same release)."""
    modules = ("CANN", "RUNTIME", "COMPILER", "HCCL", "TOOLKIT", "OPP", "OPP_KERNEL", "DRIVER")
    if module not in modules:
        raise ValueError(f"get_cann_version: module must be one of {', '.join(modules)}, "
                         f"got {module!r}")
    return CANN_VERSION


def ipc_collect() -> None:
    """Nothing to collect: npusim shares no npu memory between processes through NPU IPC."""


def current_blas_handle():
    """None, as torch_npu answers (it has no BLAS handle to give either)."""
    return None


init_dump = not_supported("init_dump", "operator data dump is a CANN (msprobe) feature; "
                          "npusim's trace is runtime.profile / torch_npu.profiler")
set_dump = not_supported("set_dump", "operator data dump is a CANN (msprobe) feature")
finalize_dump = not_supported("finalize_dump", "operator data dump is a CANN (msprobe) feature")
stress_detect = not_supported("stress_detect", "it tests AI cores / HCCS links of real hardware")
obfuscation_initialize = not_supported("obfuscation_initialize",
                                       "model obfuscation runs in a CANN kernel")
obfuscation_finalize = not_supported("obfuscation_finalize",
                                     "model obfuscation runs in a CANN kernel")
obfuscation_calculate = not_supported("obfuscation_calculate",
                                      "model obfuscation runs in a CANN kernel")
