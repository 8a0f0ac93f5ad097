"""``torch.ops.npu.<name>``: the main fused operators as torch operators too.

torch_npu registers its fused operators in the ``npu`` operator namespace, and some code calls
them there (``torch.ops.npu.npu_fusion_attention``). Each one here is defined with torch_npu's
schema and implemented at the CompositeImplicitAutograd key by the same Python function, so the
call decomposes into the composition's torch operators and autograd differentiates it as when
called as ``torch_npu.<name>``.
"""
from __future__ import annotations

import torch

from . import activation, attention, moe, norm, rope
from .misc import npu_confusion_transpose, npu_scaled_masked_softmax

_FA = ("Tensor query, Tensor key, Tensor value, int head_num, str input_layout, Tensor? pse=None, "
       "Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
       "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, "
       "int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, "
       "int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, "
       "str softmax_layout=\"\") -> (Tensor, Tensor, Tensor, Tensor, int, int, int)")
_FA_GRAD = ("Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, str input_layout, *, "
            "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
            "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, "
            "Tensor? attention_in=None, float scale_value=1., float keep_prob=1., "
            "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, "
            "int seed=0, int offset=0, int numels=0, int[]? prefix=None, "
            "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
            "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\") "
            "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")

SCHEMAS = {
    "npu_fusion_attention": (_FA, attention.npu_fusion_attention),
    "npu_fusion_attention_grad": (_FA_GRAD, attention.npu_fusion_attention_grad),
    "npu_rms_norm": ("Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
                     norm.npu_rms_norm),
    "npu_gemma_rms_norm": ("Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
                           norm.npu_gemma_rms_norm),
    "npu_add_rms_norm": ("Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
                         "-> (Tensor, Tensor, Tensor)", norm.npu_add_rms_norm),
    "npu_rotary_mul": ("Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', "
                       "Tensor? rotate=None) -> Tensor", rope.npu_rotary_mul),
    "npu_swiglu": ("Tensor self, int dim=-1) -> Tensor", activation.npu_swiglu),
    "npu_geglu": ("Tensor self, int dim=-1, int approximate=1, bool activate_left=False) "
                  "-> (Tensor, Tensor)", activation.npu_geglu),
    "npu_fast_gelu": ("Tensor self) -> Tensor", activation.npu_fast_gelu),
    "npu_scaled_masked_softmax": ("Tensor x, Tensor mask, Scalar scale=1, "
                                  "bool fixed_triu_mask=False) -> Tensor",
                                  npu_scaled_masked_softmax),
    "npu_confusion_transpose": ("Tensor self, int[] perm, int[] shape, bool transpose_first) "
                                "-> Tensor", npu_confusion_transpose),
    "npu_moe_token_permute": ("Tensor tokens, Tensor indices, int? num_out_tokens=None, "
                              "bool padded_mode=False) -> (Tensor, Tensor)",
                              moe.npu_moe_token_permute),
    "npu_moe_token_unpermute": ("Tensor permuted_tokens, Tensor sorted_indices, "
                                "Tensor? probs=None, bool padded_mode=False, "
                                "int[]? restore_shape=None) -> Tensor",
                                moe.npu_moe_token_unpermute),
    "npu_moe_gating_top_k_softmax": ("Tensor x, Tensor? finished=None, int k=1) "
                                     "-> (Tensor, Tensor, Tensor)",
                                     moe.npu_moe_gating_top_k_softmax),
}

_lib = None


def _positional(fn):
    def impl(*args, **kwargs):
        return fn(*args, **kwargs)
    return impl


def register() -> None:
    """Define ``torch.ops.npu.<name>`` for SCHEMAS (idempotent; skipped when the namespace
    already has the operator, e.g. from another library)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("npu", "FRAGMENT")
    for name, (schema, fn) in SCHEMAS.items():
        if hasattr(torch.ops.npu, name):
            continue
        _lib.define(f"{name}({schema}")
        _lib.impl(name, _positional(fn), "CompositeImplicitAutograd")
