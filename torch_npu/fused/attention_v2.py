"""``npu_fusion_attention_v2`` and ``npu_fused_infer_attention_score_v2``: the v1 operators with
torch_npu's renamed arguments and the rope split of query / key.

``query_rope`` / ``key_rope`` (MLA's rotary part, kept apart from the content part) add
``query_rope @ key_rope^T`` to the scores: they are concatenated onto query / key along D.
``pse_type`` 1 (the default) is v1's ``scale * (q @ k^T + pse)``; 0 is ``scale * q @ k^T + pse``
(computed as v1 with pse / scale). Internally generated alibi (pse_type 2, 3), ``sink`` /
``learnable_sink`` and an external ``dropout_mask`` are not supported.
"""
from __future__ import annotations

import torch

from ._common import NoKernel, check
from .attention import npu_fusion_attention
from .attention_infer import npu_fused_infer_attention_score


def _with_rope(x, rope, op: str, name: str):
    if rope is None:
        return x
    check(rope.shape[:-1] == x.shape[:-1], op, f"{name} of shape {tuple(rope.shape)} must match "
          f"{tuple(x.shape)} but in its last axis")
    return torch.cat((x, rope.to(x.dtype)), dim=-1)


def npu_fusion_attention_v2(query, key, value, head_num, input_layout, *, pse=None,
                            padding_mask=None, atten_mask=None, query_rope=None, key_rope=None,
                            scale=1., keep_prob=1., pre_tokens=2147483647,
                            next_tokens=2147483647, inner_precise=0, prefix=None,
                            actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                            gen_mask_parallel=True, sync=False, pse_type=1, q_start_idx=None,
                            kv_start_idx=None, softmax_layout="", sink=None, dropout_mask=None,
                            seed=0, offset=0):
    """torch_npu.npu_fusion_attention_v2 -> npu_fusion_attention's 7 outputs."""
    op = "npu_fusion_attention_v2"
    check((query_rope is None) == (key_rope is None), op, "query_rope and key_rope go together")
    check(pse_type in (0, 1, 2, 3), op, f"pse_type must be 0-3, got {pse_type}")
    if pse_type in (2, 3) and pse is not None:
        raise NotImplementedError(f"{op}: pse_type={pse_type} (alibi generated inside the "
                                  "kernel) is not supported on npusim")
    if sink is not None or dropout_mask is not None:
        raise NotImplementedError(f"{op}: sink / dropout_mask are not supported on npusim")
    if pse is not None and pse_type == 0:
        check(scale != 0, op, "pse_type=0 with scale=0")
        pse = pse / scale
    q = _with_rope(query, query_rope, op, "query_rope")
    k = _with_rope(key, key_rope, op, "key_rope")
    if input_layout in ("BSH", "SBH") and query_rope is not None:
        raise NotImplementedError(f"{op}: query_rope with input_layout {input_layout} is not "
                                  "supported (the real operator takes it with TND)")
    return npu_fusion_attention(q, k, value, head_num, input_layout, pse=pse,
                                padding_mask=padding_mask, atten_mask=atten_mask, scale=scale,
                                keep_prob=keep_prob, pre_tockens=pre_tokens,
                                next_tockens=next_tokens, inner_precise=inner_precise,
                                prefix=prefix, actual_seq_qlen=actual_seq_qlen,
                                actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode,
                                softmax_layout=softmax_layout)


def npu_fused_infer_attention_score_v2(
        query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None,
        actual_seq_qlen=None, actual_seq_kvlen=None, block_table=None, dequant_scale_query=None,
        dequant_scale_key=None, dequant_offset_key=None, dequant_scale_value=None,
        dequant_offset_value=None, dequant_scale_key_rope=None, quant_scale_out=None,
        quant_offset_out=None, quant_scale_p=None, learnable_sink=None, num_query_heads=1,
        num_key_value_heads=0, softmax_scale=1.0, pre_tokens=2147483647,
        next_tokens=2147483647, input_layout="BSH", sparse_mode=0, block_size=0,
        query_quant_mode=0, key_quant_mode=0, value_quant_mode=0, inner_precise=0,
        return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None,
        query_rope_dtype=None, key_rope_dtype=None, key_shared_prefix_dtype=None,
        value_shared_prefix_dtype=None, dequant_scale_query_dtype=None,
        dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
        dequant_scale_key_rope_dtype=None, out_dtype=None):
    """torch_npu.npu_fused_infer_attention_score_v2 -> (attention_out, softmax_lse):
    npu_fused_infer_attention_score with v2's argument names and the rope split."""
    op = "npu_fused_infer_attention_score_v2"
    quant = {n: v for n, v in (
        ("dequant_scale_query", dequant_scale_query), ("dequant_scale_key", dequant_scale_key),
        ("dequant_offset_key", dequant_offset_key), ("dequant_scale_value", dequant_scale_value),
        ("dequant_offset_value", dequant_offset_value),
        ("dequant_scale_key_rope", dequant_scale_key_rope), ("quant_scale_out", quant_scale_out),
        ("quant_offset_out", quant_offset_out), ("quant_scale_p", quant_scale_p),
        ("query_dtype", query_dtype), ("key_dtype", key_dtype), ("value_dtype", value_dtype),
        ("out_dtype", out_dtype)) if v is not None}
    if quant:
        raise NoKernel(f"{op}: {', '.join(quant)} (quantized attention) need a compiled CANN "
                       "kernel, which npusim does not have")
    if learnable_sink is not None:
        raise NotImplementedError(f"{op}: learnable_sink is not supported on npusim")
    check((query_rope is None) == (key_rope is None), op, "query_rope and key_rope go together")
    q = _with_rope(query, query_rope, op, "query_rope")
    k = _with_rope(key, key_rope, op, "key_rope")
    return npu_fused_infer_attention_score(
        q, k, value, pse_shift=pse_shift, atten_mask=atten_mask,
        actual_seq_lengths=actual_seq_qlen, actual_seq_lengths_kv=actual_seq_kvlen,
        block_table=block_table, num_heads=num_query_heads, scale=softmax_scale,
        pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
        num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
        inner_precise=inner_precise, block_size=block_size,
        softmax_lse_flag=return_softmax_lse)
