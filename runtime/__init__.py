"""npusim runtime: one simulated Ascend NPU per process (pyACL semantics, Pythonic names).

Devices and contexts, streams and events, the caching memory pool, copies, kernels and
profiling (docs/runtime.md, docs/memory.md). Every error is a ``runtime.errors.NpuError`` with
an ACL ``code``.
"""
from . import config as _config, errors
from .log import setup as _setup_log
from .array import DeviceArray, as_dtype, empty, to_device, zeros
from .context import (current_stream, default_stream, device_count, get_device, get_mem_info,
                      reset_device, set_device, stream, synchronize)
from .errors import NpuError
from .event import Event
from .graph import Graph, graph
from .kernels import launch, launch_callback, read_only
from .memory import (DevicePtr, HostBuffer, MemcpyKind, buffer_nbytes, empty_cache, free, free_host,
                     host_view, malloc, malloc_host, max_memory_allocated, max_memory_reserved,
                     memcpy, memcpy_async, memory_allocated, memory_reserved, memory_snapshot,
                     memory_stats, memory_summary, memset, memset_async, record_stream,
                     reset_peak_memory_stats, set_per_process_memory_fraction)
from .pool import MemMallocPolicy
from .profiler import profile
from .sanitizer import declare_access, enable_stream_check, stream_check_enabled
from .stream import Stream

_setup_log("runtime")
if _config.stream_check() != "off":
    enable_stream_check(_config.stream_check())

__all__ = [
    "DeviceArray", "DevicePtr", "Event", "Graph", "HostBuffer", "MemMallocPolicy", "MemcpyKind", "NpuError",
    "Stream", "as_dtype", "buffer_nbytes", "current_stream", "default_stream", "device_count",
    "empty", "empty_cache", "errors", "free", "free_host", "get_device", "get_mem_info", "graph",
    "host_view", "declare_access", "enable_stream_check", "launch", "launch_callback", "malloc",
    "malloc_host", "max_memory_allocated",
    "max_memory_reserved", "memcpy", "memcpy_async", "memory_allocated", "memory_reserved",
    "memory_snapshot", "memory_stats", "memory_summary", "memset", "memset_async", "profile",
    "read_only", "record_stream", "stream_check_enabled",
    "reset_device", "reset_peak_memory_stats", "set_device", "set_per_process_memory_fraction",
    "stream", "synchronize", "to_device", "zeros",
]
