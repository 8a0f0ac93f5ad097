"""torch.npu's memory statistics: npusim's caching pool of each simulated NPU."""
from __future__ import annotations

import runtime
from runtime.torch import device as _device


def _dev(device) -> int:
    d = _device.check_index(device)
    with _device.on(d):          # creates the device's context on first use
        pass
    return d


def memory_allocated(device=None) -> int:
    return runtime.memory_allocated(_dev(device))


def max_memory_allocated(device=None) -> int:
    return runtime.max_memory_allocated(_dev(device))


def memory_reserved(device=None) -> int:
    return runtime.memory_reserved(_dev(device))


def max_memory_reserved(device=None) -> int:
    return runtime.max_memory_reserved(_dev(device))


def reset_peak_memory_stats(device=None) -> None:
    runtime.reset_peak_memory_stats(_dev(device))


def reset_max_memory_allocated(device=None) -> None:
    runtime.reset_peak_memory_stats(_dev(device))


def memory_stats(device=None) -> dict:
    return runtime.memory_stats(_dev(device))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    return runtime.memory_summary(_dev(device))


def memory_snapshot() -> list:
    return runtime.memory_snapshot(_dev(None))


def empty_cache() -> None:
    runtime.empty_cache()


def mem_get_info(device=None) -> tuple:
    with _device.on(_dev(device)):
        return runtime.get_mem_info()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    runtime.set_per_process_memory_fraction(fraction, _dev(device))
