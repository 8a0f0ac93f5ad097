"""torch.npu._recovery: torch_npu's recovery from device faults (UCE memory errors, a device
stopped and restarted). A simulated NPU has no hardware faults to recover from: each name
raises NotSupportedError saying so (npurun's restart is npusim's recovery: docs/launcher.md)."""
from __future__ import annotations

from .utils import not_supported

_WHY = "it recovers a real device from a hardware fault (UCE / link down)"

__all__ = ["check_npu_storage_is_safe", "check_npu_tensor_is_safe", "mark_all_npu_tensor_unsafe",
           "update_npu_storage_to_safe", "update_npu_tensor_to_safe",
           "set_npu_tensor_unsafe_check_flag", "get_npu_tensor_unsafe_check_flag",
           "restart_device", "stop_device"]

for _n in __all__:
    globals()[_n] = not_supported(_n, _WHY, "torch.npu._recovery")
del _n
