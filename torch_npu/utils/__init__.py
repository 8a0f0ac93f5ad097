"""torch_npu.utils: the helpers real code reaches here.

``npu_combine_tensors`` (tensors re-pointed into one flat npu buffer, as torch_npu's
``npu_change_data_ptr`` does: here ``Tensor.set_`` onto the buffer's storage), ``FlopsCounter``
(torch's FlopCounterMode), thread affinity, ``get_cann_version``; ``collect_env``,
``cpp_extension``, ``flops_count``, ``profiler`` as submodules. Silent-data-corruption detection
(``register_asd_hook``, ``set_asd_loss_scale``) watches real hardware and raises
NotSupportedError here.
"""
from __future__ import annotations

import os
import threading

from ..npu.utils import get_cann_version, not_supported
from . import collect_env, cpp_extension, flops_count, profiler  # noqa: F401
from .combine_tensors import get_part_combined_tensor, is_combined_tensor_valid, npu_combine_tensors
from .flops_count import FlopsCounter

__all__ = ["npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid",
           "FlopsCounter", "set_thread_affinity", "reset_thread_affinity", "get_cann_version"]

_PROCESS_CPUS = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def set_thread_affinity(core_range=None) -> None:
    """Bind the calling thread to ``core_range`` ([first, last], or a list of them; None: the
    process's cores)."""
    if _PROCESS_CPUS is None:
        return
    if core_range is None:
        cpus = set(_PROCESS_CPUS)
    else:
        ranges = core_range if core_range and isinstance(core_range[0], (list, tuple)) \
            else [core_range]
        cpus = set()
        for r in ranges:
            if len(r) != 2 or r[0] > r[1]:
                raise ValueError(f"set_thread_affinity: a core range is [first, last], got {r!r}")
            cpus |= set(range(r[0], r[1] + 1))
        cpus &= set(_PROCESS_CPUS)
        if not cpus:
            raise ValueError(f"set_thread_affinity: {core_range!r} holds none of this process's "
                             f"cores {sorted(_PROCESS_CPUS)}")
    os.sched_setaffinity(threading.get_native_id(), cpus)


def reset_thread_affinity() -> None:
    """The calling thread back on every core the process had at import."""
    set_thread_affinity(None)


_ASD = "silent data corruption detection checks a real NPU's arithmetic"
register_asd_hook = not_supported("register_asd_hook", _ASD, "torch_npu.utils")
set_asd_loss_scale = not_supported("set_asd_loss_scale", _ASD, "torch_npu.utils")
