"""The memory room: device memory as a caller sees it, and the caching pool's layers under it.

Layers, top to bottom (each imports only the ones below it, and ``runtime``'s core modules):

- ``pointers`` (DevicePtr, DeviceBuffer, HostBuffer, the liveness and bounds checks),
  ``alloc`` (malloc / free, the graph-private pool, the statistics) and ``copies`` (memcpy /
  memset): the public API, re-exported here (``runtime.memory.malloc`` ...);
- ``pool`` (CachingAllocator: the policy) over ``front_cache``, ``free_lists``, ``blocks``,
  ``stats`` and ``pool_args``: pure, no device, no threads (docs/memory.md);
- ``device_memory`` (a device's raw allocator over a memfd), ``card`` (the card's ledger the
  processes sharing one device charge) and ``ipc`` (that memory mapped by the other processes
  of the node: hccl's shared-memory data path).

``runtime.context`` makes each device's ``DeviceMemory`` and ``CachingAllocator``; the API
modules import the context, never the reverse. So this package imports nothing when it loads:
its names load with their module on first use (PEP 562), and ``import runtime.memory.pool``
(what the context does) does not pull the API in. The old paths ``runtime.pool``,
``runtime.blocks``, ``runtime.card``, ``runtime.ipc`` ... are aliases of these modules
(runtime/aliases.py).
"""
from __future__ import annotations

import importlib

_NAMES = {     # submodule -> the public names it defines, re-exported here
    "pointers": ("DEVICE_TYPES", "DeviceBuffer", "DevicePtr", "FreePoint", "HostBuffer",
                 "MemcpyKind", "allocation_marks", "buffer_nbytes", "device_region", "free_host",
                 "host_view", "malloc_host", "queued_before_free", "record_stream",
                 "same_allocations"),
    "alloc": ("PrivatePool", "card_holders", "empty_cache", "free", "free_from_gc",
              "get_per_process_memory_fraction", "malloc", "malloc_at", "max_memory_allocated",
              "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_snapshot",
              "memory_stats", "memory_summary", "private_pool", "reset_peak_memory_stats",
              "set_per_process_memory_fraction"),
    "copies": ("memcpy", "memcpy_async", "memset", "memset_async", "run_sync"),
    "pool": ("MemMallocPolicy",),
}
_EXPORTS = {name: mod for mod, names in _NAMES.items() for name in names}
_SUBMODULES = ("alloc", "blocks", "card", "copies", "device_memory", "free_lists", "front_cache",
               "ipc", "pointers", "pool", "pool_args", "stats")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        if name in _SUBMODULES:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*__all__, *_SUBMODULES])
