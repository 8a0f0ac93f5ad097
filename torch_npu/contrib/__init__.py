"""torch_npu.contrib: torch_npu's composed helpers and modules (function/, module/), and
``from torch_npu.contrib import transfer_to_npu``, which runs CUDA scripts on npu (imported
only when asked for: it patches torch)."""
from .function import (npu_fast_condition_index_put, npu_fused_attention,  # noqa: F401
                       npu_fused_attention_with_layernorm, npu_iou, npu_ptiou,
                       npu_single_level_responsible_flags)
from .module import (DCNv2, FastBatchNorm1d, FastBatchNorm2d, FastBatchNorm3d,  # noqa: F401
                     ModulatedDeformConv, NpuPreGenDropout, Prefetcher)
