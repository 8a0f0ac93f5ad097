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
    # before any NPU is in use there is no cache: a no-op, as torch.cuda.empty_cache before
    # CUDA is initialized (accelerate calls it on CPU runs too: tests/libs/test_cpu_use.py)
    from runtime.errors import ContextError
    try:
        runtime.empty_cache()
    except ContextError:
        pass


def mem_get_info(device=None) -> tuple:
    with _device.on(_dev(device)):
        return runtime.get_mem_info()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    runtime.set_per_process_memory_fraction(fraction, _dev(device))


def memory_cached(device=None) -> int:
    """torch_npu's old name of ``memory_reserved``."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """torch_npu's old name of ``max_memory_reserved``."""
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    """torch_npu's old name: resets the peaks (``reset_peak_memory_stats``)."""
    runtime.reset_peak_memory_stats(_dev(device))


def memory_stats_as_nested_dict(device=None) -> dict:
    """``memory_stats`` with its dotted keys as nested dicts (``{"allocated_bytes": {"all":
    {"current": ...}}}``), as torch's function of that name."""
    out: dict = {}
    for key, value in memory_stats(device).items():
        node = out
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction of the NPU's capacity its pool may reserve (set_per_process_memory_fraction)."""
    from runtime.memory import get_per_process_memory_fraction as fraction
    with _device.on(_dev(device)):
        return fraction()


_ALLOC = "npusim's caching pool (runtime/memory/pool.py) is the only allocator"


def _unsupported():
    from .utils import not_supported, unsupported_class
    return (unsupported_class("MemPool", _ALLOC), unsupported_class("NPUPluggableAllocator", _ALLOC),
            not_supported("use_mem_pool", _ALLOC), not_supported("change_current_allocator", _ALLOC))


MemPool, NPUPluggableAllocator, use_mem_pool, change_current_allocator = _unsupported()


_raw: dict = {}       # device pointer -> the uint8 npu tensor that owns it


def caching_allocator_alloc(size: int, device=None, stream=None) -> int:
    """``size`` bytes from the NPU's pool, allocated on ``stream`` (the current one if None);
    returns the device pointer (an int). The block lives until ``caching_allocator_delete(ptr)``
    (a uint8 npu tensor holds it meanwhile)."""
    import torch
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"caching_allocator_alloc: size must be an int >= 0, got {size!r}")
    d = _dev(device)
    from .utils import StreamContext
    with _device.on(d), StreamContext(stream):     # the block belongs to ``stream`` (if given)
        t = torch.empty(size, dtype=torch.uint8, device=torch.device("npu", d))
    ptr = t.data_ptr()
    _raw[ptr] = t
    return ptr


def caching_allocator_delete(mem_ptr: int) -> None:
    """Give back a block from ``caching_allocator_alloc``."""
    if _raw.pop(mem_ptr, None) is None:
        raise ValueError(f"caching_allocator_delete: {mem_ptr:#x} was not allocated by "
                         "caching_allocator_alloc (or was freed already)")


def _snapshot(device=None) -> dict:
    """torch's memory-snapshot dict (``torch.cuda.memory._snapshot``'s form): ``segments`` from
    npusim's pool (streams as their ids) and ``device_traces`` (empty: the pool keeps no
    allocation history)."""
    segs = []
    for seg in memory_snapshot():
        seg = dict(seg)
        seg["stream"] = getattr(seg.get("stream"), "id", 0)
        seg["blocks"] = [dict(b, stream=getattr(b.get("stream"), "id", 0))
                         for b in seg.get("blocks", [])]
        segs.append(seg)
    return {"segments": segs, "device_traces": [[] for _ in range(runtime.device_count())],
            "allocator_settings": {}}


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle ``_snapshot()`` to ``filename`` (torch's memory_viz reads the segments)."""
    import pickle
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=None,
                           device=None, **kwargs) -> None:
    """Turning recording off is accepted; turning it on raises NotSupportedError: npusim's pool
    keeps no allocation history (``_snapshot`` has its segments and blocks with their sites)."""
    if enabled in (None, False):
        return
    from .utils import NotSupportedError
    raise NotSupportedError("torch.npu.memory._record_memory_history is not supported by "
                            "npusim: its pool keeps no allocation history (torch.npu.memory."
                            "_snapshot() has the segments and blocks, with their sites)")
