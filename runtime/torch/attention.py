"""``scaled_dot_product_attention`` on npu tensors: the kernel the CPU would pick.

torch chooses an attention kernel per device through a C++ dispatch stub that a Python backend
cannot fill, so for ``npu`` it always took the math decomposition: a dozen small operators
forward and backward where CPU eager runs one fused kernel each way, and results that differ from
the CPU's in the last bits (``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` use it).

Here the operator's composite is replaced for npu at the AutogradPrivateUse1 key (where a
composite's autograd is decided) by the CPU's decision: torch's own chooser,
``_fused_sdp_choice``, runs on CPU views (factories.sdp_choice) and answers what it answers for
CPU tensors of these shapes, mask and ``enable_gqa``. When that is the fused CPU kernel, it runs
as on CPU, ``_scaled_dot_product_flash_attention_for_cpu`` with its own backward (a boolean mask
made additive first, as torch's sdpa does), so results are bitwise the CPU's, masks and
grouped-query attention (transformers' Llama) included; any other case (dropout, another
choice) takes torch's decomposition as before.
"""
from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from .factories import sdp_choice        # the chooser on CPU views, without the fallback

_FLASH = int(SDPBackend.FLASH_ATTENTION)
_sdpa = torch.ops.aten.scaled_dot_product_attention.default
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    # CPU's chooser answers the math path for a mask that requires grad (the fused kernel has
    # no gradient for it); the CPU views it sees here carry no requires_grad, so ask first
    if dropout_p == 0.0 and not (attn_mask is not None and attn_mask.requires_grad):
        mask = attn_mask
        if mask is not None and mask.dtype == torch.bool:     # as torch's sdpa converts it
            mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(
                mask.logical_not(), float("-inf"))
        if sdp_choice(query, key, value, mask, dropout_p, is_causal, scale=scale,
                      enable_gqa=enable_gqa) == _FLASH:
            return _flash(query, key, value, dropout_p, is_causal, attn_mask=mask,
                          scale=scale)[0]
    return _sdpa.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                           enable_gqa=enable_gqa)


def register(lib) -> None:
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
