"""``torch.npu`` (torch_npu.npu): devices, streams, memory, seeds and options of npusim's NPUs.

Every name of torch_npu 2.14.0's ``torch_npu.npu.__all__`` is here (docs/coverage.md lists them).
A name with a meaning on a simulated NPU behaves as torch_npu's: the device and stream functions,
the RNG (``torch.npu.random``, ``*_all``, ``default_generators``), ``_lazy_call``, the legacy
tensor types (legacy.py), device properties as an Ascend 910B1 reports them, the memory
statistics of npusim's pool, the CANN options (recorded and read back: options.py, aclnn.py),
``mstx`` ranges in npusim's trace (mstx.py), amp, graph capture (graphs.py). A name tied to what
a simulation has not (CANN graph-compiler features, fault recovery, dump, pluggable allocators)
is a callable raising
``NotSupportedError`` (a NotImplementedError) that says why; ``hasattr`` still finds it, as on
a machine with torch_npu.
"""
from __future__ import annotations

import os
import warnings

import torch

import runtime
from runtime.torch import device as _device
from runtime.torch import random as _random_gens

from . import _recovery, aclnn, amp, legacy, memory, mstx as _mstx_module, options, random, utils  # noqa: F401,E501
from .memory import (caching_allocator_alloc, caching_allocator_delete, empty_cache,
                     get_per_process_memory_fraction, max_memory_allocated,
                     max_memory_cached, max_memory_reserved, mem_get_info, memory_allocated,
                     memory_cached, memory_reserved, memory_snapshot, memory_stats,
                     memory_stats_as_nested_dict, memory_summary, reset_max_memory_allocated,
                     reset_max_memory_cached, reset_peak_memory_stats,
                     set_per_process_memory_fraction)
from .mstx import mstx
from .options import (CubeMathType, config, conv, get_device_limit, get_mm_bmm_format_nd,
                      get_option, get_stream_limit, is_jit_compile_false, matmul,
                      reset_stream_limit, set_aoe, set_compile_mode, set_device_limit,
                      set_mm_bmm_format_nd, set_option, set_stream_limit)
from .random import (get_rng_state, get_rng_state_all, initial_seed, manual_seed,
                     manual_seed_all, seed, seed_all, set_rng_state, set_rng_state_all)
from .streams import Event, Stream
from .utils import (NotSupportedError, StreamContext, unsupported_class, check_uce_in_memory,
                    clear_npu_overflow_flag, current_blas_handle, current_device, current_stream,
                    default_stream, device, device_of, finalize_dump, get_npu_overflow_flag,
                    get_sync_debug_mode, get_task_queue_enable, init_dump, ipc_collect,
                    is_bf16_supported, not_supported, obfuscation_calculate,
                    obfuscation_finalize, obfuscation_initialize, set_device, set_dump,
                    set_op_timeout_ms, set_stream, set_sync_debug_mode, set_task_queue_enable,
                    stream, stress_detect, synchronize)

NPUSIM = True                  # runtime.torch.register tells npusim's module from a real one
OutOfMemoryError = torch.OutOfMemoryError     # npusim's OOM (runtime.errors) is a subclass

from runtime.acl import SOC_NAME  # noqa: E402 - "Ascend910B1", what acl.get_soc_name reports
L2_CACHE_BYTES = 192 * 1024 * 1024            # a 910B1's L2, as its properties report it

# ---- initialization: npusim's devices exist from import on ----------------------------------

_initialized = True
_queued_calls: list = []


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    _device.current()


def _lazy_init() -> None:
    _device.current()


def _lazy_call(callable, **kwargs) -> None:
    """Run ``callable`` now: torch_npu queues it until the device initializes, and npusim's is
    initialized at import (DeepSpeed's ``lazy_call``, torch.cuda's seeding helpers)."""
    callable()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return runtime.device_count()


def can_device_access_peer(device_id, peer_device_id) -> bool:
    """True for two valid devices: npusim copies between any two NPUs of a node."""
    _device.check_index(device_id, "device_id")
    _device.check_index(peer_device_id, "peer_device_id")
    return True


# ---- what the card reports -------------------------------------------------------------------

def get_device_name(device=None) -> str:
    """The chip's name, as torch_npu reports it: ``"Ascend910B1"`` (npusim's simulated SoC)."""
    _device.check_index(device)
    return SOC_NAME


class _NPUDeviceProperties:
    """``torch.npu.get_device_properties(i)``: name, total_memory (the simulated NPU's capacity,
    NPUSIM_HBM_BYTES), cube_core_num, vector_core_num and L2_cache_size as a 910B1 has them."""

    __slots__ = ("name", "total_memory", "cube_core_num", "vector_core_num", "L2_cache_size")

    def __init__(self, name, total_memory, cube, vector, l2):
        self.name, self.total_memory = name, total_memory
        self.cube_core_num, self.vector_core_num, self.L2_cache_size = cube, vector, l2

    def __repr__(self):
        return (f"_NPUDeviceProperties(name='{self.name}', total_memory="
                f"{self.total_memory // (1024 * 1024)}MB, cube_core_num={self.cube_core_num}, "
                f"vector_core_num={self.vector_core_num}, "
                f"L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB)")


def get_device_properties(device=None) -> _NPUDeviceProperties:
    d = _device.check_index(device)
    with _device.on(d):
        total = runtime.get_mem_info()[1]
    return _NPUDeviceProperties(SOC_NAME, total, options.CUBE_CORES, options.VECTOR_CORES,
                                L2_CACHE_BYTES)


class _DeviceCapability(tuple):
    """``(major, minor)`` with ``.major`` / ``.minor``."""

    def __new__(cls, major: int, minor: int):
        return super().__new__(cls, (major, minor))

    major = property(lambda self: self[0])
    minor = property(lambda self: self[1])


_CAPABILITY_NOTE = ("The return value of get_device_capability is only for compatibility with "
                    "PyTorch and does not represent the actual capability of the NPU device.")


def get_device_capability(device=None):
    """torch_npu's answer: ``TORCH_NPU_DEVICE_CAPABILITY`` ("major.minor", e.g. "8.0") as
    ``(major, minor)`` (here also with ``.major`` / ``.minor``), else None with a warning. A
    script that unpacks it needs the variable set, on an Ascend machine as here."""
    if device is not None:
        _device.check_index(device)
    env = os.environ.get("TORCH_NPU_DEVICE_CAPABILITY")
    if not env:
        warnings.warn("You can set the device capability via the environment variable "
                      f"TORCH_NPU_DEVICE_CAPABILITY. {_CAPABILITY_NOTE}")
        return None
    major, dot, minor = env.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        warnings.warn("torch.npu.get_device_capability can't parse TORCH_NPU_DEVICE_CAPABILITY "
                      f"environment variable: {env}. Expected format is 'major.minor' where "
                      "major and minor are non-negative integers (e.g., '8.0').")
        return None
    warnings.warn(_CAPABILITY_NOTE)
    return _DeviceCapability(int(major), int(minor))


def utilization(device=None) -> int:
    """0: npusim keeps no AI-core utilization rate (the profiler's summary has busy times)."""
    _device.check_index(device)
    return 0


def get_soc_version() -> int:
    """torch_npu's SoC enum value of the Ascend910B1 (220)."""
    return 220


# ---- RNG -------------------------------------------------------------------------------------

default_generators: tuple = tuple(_random_gens.generator(i) for i in range(runtime.device_count()))


# ---- amp ------------------------------------------------------------------------------------

def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("npu")


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("npu", enabled)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("npu", dtype)


# ---- determinism and implementation switches -----------------------------------------------

def enable_deterministic_with_backward(tensor: torch.Tensor) -> torch.Tensor:
    """Deterministic algorithms on from here in forward (and off again at this point in
    backward), as torch_npu's. npusim's CPU kernels are deterministic either way."""
    torch.use_deterministic_algorithms(True)
    return tensor


def disable_deterministic_with_backward(tensor: torch.Tensor) -> torch.Tensor:
    torch.use_deterministic_algorithms(False)
    return tensor


def set_deterministic_level(level: int) -> None:
    """0: non-deterministic allowed; >= 1: ``torch.use_deterministic_algorithms(True)``."""
    if isinstance(level, bool) or not isinstance(level, int) or level < 0:
        raise ValueError(f"set_deterministic_level: level must be an int >= 0, got {level!r}")
    torch.use_deterministic_algorithms(level >= 1)
    set_option({"DETERMINISTIC_LEVEL": str(level)})


def use_compatible_impl(is_enable: bool) -> None:
    set_option({"TORCH_NPU_USE_COMPATIBLE_IMPL": "1" if is_enable else "0"})


def are_compatible_impl_enabled() -> bool:
    return get_option("TORCH_NPU_USE_COMPATIBLE_IMPL") == "1"


def empty_virt_addr_cache() -> None:
    """``empty_cache``: npusim's pool has no separate virtual-address cache."""
    empty_cache()


def get_allocator_backend() -> str:
    """"native": npusim's caching pool (runtime/pool.py) is the allocator."""
    return "native"


def host_empty_cache() -> None:
    """Nothing to release: npusim keeps no cache of pinned host blocks."""


# ---- legacy tensor types and typed storages --------------------------------------------------

globals().update(legacy.tensor_types)
globals().update(legacy.storage_types)


# ---- names with no meaning on a simulated NPU -----------------------------------------------

_unsupported_class = unsupported_class

_GRAPH = ("task groups and handlers of an ACL graph need CANN's capture; npusim's NPUGraph "
          "(torch.npu.NPUGraph, graphs.py) captures and replays whole graphs only")
_HOST = "npusim keeps no pool of pinned host blocks to count"

NpuGraphOpHandler = _unsupported_class("NpuGraphOpHandler", _GRAPH)
MemPool, NPUPluggableAllocator = memory.MemPool, memory.NPUPluggableAllocator
use_mem_pool, change_current_allocator = memory.use_mem_pool, memory.change_current_allocator
SyncLaunchStream = _unsupported_class("SyncLaunchStream",
                                      "a stream launching synchronously is an ACL runtime mode")
ExternalStream = _unsupported_class("ExternalStream", "an aclrtStream made outside torch_npu "
                                    "does not exist in a simulation")
ExternalEvent = _unsupported_class("ExternalEvent", "an aclrtEvent made outside torch_npu does "
                                   "not exist in a simulation")

stop_device, restart_device = _recovery.stop_device, _recovery.restart_device

for _name, _why in {
        "graph_task_group_begin": _GRAPH, "graph_task_group_end": _GRAPH,
        "graph_task_update_begin": _GRAPH, "graph_task_update_end": _GRAPH,
        "register_npu_graph_handler": _GRAPH,
        "super_kernel_scope_begin": "super kernels are fused by CANN's graph compiler",
        "super_kernel_scope_end": "super kernels are fused by CANN's graph compiler",
        "reset_accumulated_memory_stats": "npusim's pool keeps its accumulated counters "
                                          "(reset_peak_memory_stats resets the peaks)",
        "host_memory_stats": _HOST, "host_memory_stats_as_nested_dict": _HOST,
        "reset_accumulated_host_memory_stats": _HOST, "reset_peak_host_memory_stats": _HOST,
        "npurt": "the ACL runtime's raw API is npusim's runtime package (import runtime)",
        }.items():
    globals()[_name] = not_supported(_name, _why)
del _name, _why
from .graphs import NPUGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables  # noqa: E402,E501 - graphs.py
__import__("runtime.torch.compile").torch.compile.install()   # inductor on npu (runtime/torch/compile.py)

__all__ = [
    "is_initialized", "init", "set_dump", "synchronize", "device_count",
    "can_device_access_peer", "set_device", "current_device", "get_device_name",
    "get_device_properties", "get_device_capability", "mem_get_info", "is_available", "device",
    "device_of", "StreamContext", "stream", "set_stream", "current_stream", "default_stream",
    "set_sync_debug_mode", "get_sync_debug_mode", "set_task_queue_enable",
    "get_task_queue_enable", "init_dump", "utilization", "finalize_dump", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "initial_seed", "caching_allocator_alloc",
    "caching_allocator_delete", "get_per_process_memory_fraction",
    "set_per_process_memory_fraction", "empty_cache", "empty_virt_addr_cache", "memory_stats",
    "memory_stats_as_nested_dict", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
    "max_memory_cached", "memory_snapshot", "memory_summary", "MemPool", "use_mem_pool",
    "get_allocator_backend", "NPUPluggableAllocator", "change_current_allocator", "Stream",
    "Event", "set_option", "CubeMathType", "set_aoe", "set_compile_mode", "set_mm_bmm_format_nd",
    "get_mm_bmm_format_nd", "get_npu_overflow_flag", "clear_npu_overflow_flag", "stress_detect",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "is_jit_compile_false", "get_amp_supported_dtype", "is_autocast_enabled",
    "is_bf16_supported", "set_autocast_enabled", "get_autocast_dtype", "set_autocast_dtype",
    *legacy.storage_types, *legacy.tensor_types, "current_blas_handle", "stop_device",
    "restart_device", "check_uce_in_memory", "config", "matmul", "conv",
    "enable_deterministic_with_backward", "disable_deterministic_with_backward", "mstx",
    "SyncLaunchStream", "NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing",
    "make_graphed_callables", "ExternalEvent", "ExternalStream", "graph_task_group_begin",
    "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end",
    "set_device_limit", "get_device_limit", "set_stream_limit", "reset_stream_limit",
    "get_stream_limit", "ipc_collect", "obfuscation_initialize", "obfuscation_finalize",
    "obfuscation_calculate", "set_op_timeout_ms", "host_empty_cache", "host_memory_stats",
    "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats", "set_deterministic_level", "use_compatible_impl",
    "are_compatible_impl_enabled", "NpuGraphOpHandler", "register_npu_graph_handler",
    "super_kernel_scope_begin", "super_kernel_scope_end", "npurt",
]
