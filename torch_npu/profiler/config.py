"""torch_npu.profiler's levels, AI-core metrics, export types and ``_ExperimentalConfig``.

The constants are torch_npu's strings. npusim records the same trace whatever they say (it has
no msprof collection levels or AI-core counters); ``_ExperimentalConfig`` checks its arguments as
torch_npu does and keeps them (``prof.experimental_config``).
"""
from __future__ import annotations

import warnings

__all__ = ["ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem", "_ExperimentalConfig",
           "supported_profiler_level", "supported_ai_core_metrics", "supported_export_type"]


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Db = "db"
    Text = "text"


class HostSystem:
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"


def supported_profiler_level() -> set:
    return {ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2,
            ProfilerLevel.Level_none}


def supported_ai_core_metrics() -> set:
    return {v for k, v in vars(AiCMetrics).items() if not k.startswith("_")}


def supported_export_type() -> set:
    return {ExportType.Db, ExportType.Text}


def _values(cls) -> set:
    return {v for k, v in vars(cls).items() if not k.startswith("_")}


class _ExperimentalConfig:
    """torch_npu's experimental profiler settings, checked and kept (no effect on the trace)."""

    def __init__(self, profiler_level: str = ProfilerLevel.Level0,
                 aic_metrics: str = AiCMetrics.PipeUtilization, l2_cache: bool = False,
                 msprof_tx: bool = False, mstx: bool = False, data_simplification: bool = True,
                 record_op_args: bool = False, op_attr: bool = False,
                 gc_detect_threshold=None, export_type=ExportType.Text, host_sys=None,
                 mstx_domain_include=None, mstx_domain_exclude=None, sys_io: bool = False,
                 sys_interconnection: bool = False):
        if profiler_level not in supported_profiler_level():
            raise ValueError(f"profiler_level must be one of ProfilerLevel's "
                             f"({sorted(supported_profiler_level())}), got {profiler_level!r}")
        if aic_metrics not in supported_ai_core_metrics():
            raise ValueError(f"aic_metrics must be one of AiCMetrics', got {aic_metrics!r}")
        if profiler_level in (ProfilerLevel.Level0, ProfilerLevel.Level_none) and \
                aic_metrics != AiCMetrics.AiCoreNone:
            aic_metrics = AiCMetrics.AiCoreNone      # torch_npu resets it too (Level1+ only)
        if not export_type:                           # torch_npu resets it with a warning
            warnings.warn(f"Invalid parameter export_type: {export_type!r}, reset it to text.")
            export_type = ExportType.Text
        types = [export_type] if isinstance(export_type, str) else list(export_type)
        if any(t not in supported_export_type() for t in types):
            raise ValueError(f"export_type must be ExportType.Text / ExportType.Db or a list of "
                             f"them, got {export_type!r}")
        hosts = list(host_sys or [])
        if any(h not in _values(HostSystem) for h in hosts):
            raise ValueError(f"host_sys must hold HostSystem values, got {host_sys!r}")
        for name, v in (("l2_cache", l2_cache), ("msprof_tx", msprof_tx), ("mstx", mstx),
                        ("data_simplification", data_simplification),
                        ("record_op_args", record_op_args), ("op_attr", op_attr),
                        ("sys_io", sys_io), ("sys_interconnection", sys_interconnection)):
            if not isinstance(v, bool):
                raise TypeError(f"_ExperimentalConfig: {name} must be a bool, got {v!r}")
        if msprof_tx:
            warnings.warn("The parameter msprof_tx will be deprecated. Please use the new "
                          "parameter mstx instead.")
        self._profiler_level, self._aic_metrics = profiler_level, aic_metrics
        self._l2_cache, self._msprof_tx, self._mstx = l2_cache, msprof_tx, mstx
        self._data_simplification, self.record_op_args = data_simplification, record_op_args
        self._op_attr, self._gc_detect_threshold = op_attr, gc_detect_threshold
        self._export_type, self._host_sys = sorted(set(types)), hosts
        self._mstx_domain_include = list(mstx_domain_include or [])
        self._mstx_domain_exclude = list(mstx_domain_exclude or [])
        self._sys_io, self._sys_interconnection = sys_io, sys_interconnection

    @property
    def export_type(self) -> list:
        return self._export_type

    @property
    def with_gc(self) -> bool:
        return self._gc_detect_threshold is not None

    @property
    def gc_detect_threshold(self):
        return self._gc_detect_threshold

    @property
    def tx_enabled(self) -> bool:
        return self._msprof_tx or self._mstx

    def __repr__(self):
        return (f"_ExperimentalConfig(profiler_level={self._profiler_level!r}, aic_metrics="
                f"{self._aic_metrics!r}, export_type={self._export_type!r})")
