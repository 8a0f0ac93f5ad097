"""``torch.npu`` (torch_npu.npu): devices, streams, events, memory and seeds of npusim's NPUs."""
from __future__ import annotations

import torch

import runtime
from runtime.torch import device as _device
from runtime.torch import random as _random

from . import amp
from .memory import (empty_cache, max_memory_allocated, max_memory_reserved, mem_get_info,
                     memory_allocated, memory_reserved, memory_snapshot, memory_stats,
                     memory_summary, reset_max_memory_allocated, reset_peak_memory_stats,
                     set_per_process_memory_fraction)
from .options import config, get_option, is_jit_compile_false, set_compile_mode, set_option
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream

NPUSIM = True                  # runtime.torch.register tells npusim's module from a real one


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    _device.current()


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    _device.current()


def device_count() -> int:
    return runtime.device_count()


def current_device() -> int:
    return _device.current()


def set_device(device) -> None:
    """Bind the calling thread to simulated NPU ``device`` (int, 'npu:N' or torch.device); the
    thread then runs its backward passes itself (runtime/torch/device.py, the note)."""
    runtime.set_device(_device.check_index(device))
    _device.bind_thread()


def get_device_name(device=None) -> str:
    d = _device.check_index(device)
    return f"npusim simulated NPU {d}"


def get_device_properties(device=None):
    d = _device.check_index(device)
    with _device.on(d):
        total = runtime.get_mem_info()[1]

    class _Props:
        name = get_device_name(d)
        total_memory = total
        type = "npu"
    return _Props()


def get_device_capability(device=None):
    return (0, 0)


def synchronize(device=None) -> None:
    """Wait for every stream of ``device`` (the current one by default)."""
    d = _device.check_index(device)
    with _device.on(d):
        runtime.synchronize()


class device:
    """``with torch.npu.device(i):`` makes ``i`` the current device for the block."""

    def __init__(self, device):
        self.idx = _device.check_index(device)
        self.prev = None

    def __enter__(self):
        self.prev = _device.current()
        runtime.set_device(self.idx)

    def __exit__(self, *exc):
        runtime.set_device(self.prev)
        return False


def manual_seed(seed) -> None:
    _random.manual_seed(seed, _device.current())


def manual_seed_all(seed) -> None:
    _random.manual_seed_all(seed, runtime.device_count())


def seed() -> None:
    _random.generator(_device.current()).seed()


def seed_all() -> None:
    for i in range(runtime.device_count()):
        _random.generator(i).seed()


def initial_seed() -> int:
    return _random.generator(_device.current()).initial_seed()


def get_rng_state(device="npu") -> torch.Tensor:
    d = _device.check_index(device)
    return _random.generator(d).get_state()


def set_rng_state(new_state, device="npu") -> None:
    d = _device.check_index(device)
    _random.generator(d).set_state(new_state)


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    return True


def utilization(device=None) -> int:
    return 0


__all__ = [
    "Event", "Stream", "amp", "config", "current_device", "current_stream", "default_stream",
    "device", "device_count", "empty_cache", "get_device_name", "get_rng_state", "initial_seed",
    "is_available", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
    "memory_stats", "memory_summary", "reset_peak_memory_stats", "seed", "seed_all",
    "set_compile_mode", "set_device", "set_option", "set_rng_state", "stream", "synchronize",
]
