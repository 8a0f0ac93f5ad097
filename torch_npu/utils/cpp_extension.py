"""torch_npu.utils.cpp_extension: building C++ operators against CANN (not possible here)."""
from __future__ import annotations

from ..npu.utils import NotSupportedError


def NpuExtension(name, sources, *args, **kwargs):
    """Raises NotSupportedError: an NPU extension compiles against CANN's headers and libraries,
    which npusim does not have (ASCEND_HOME_PATH names an empty directory here)."""
    raise NotSupportedError(f"torch_npu.utils.cpp_extension.NpuExtension({name!r}) is not "
                            "supported by npusim: it compiles against CANN, which a simulated "
                            "NPU does not have; write the operator in Python on torch ops")


NpuExtension._npusim_not_supported = True
