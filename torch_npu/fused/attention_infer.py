"""Inference attention: ``npu_prompt_flash_attention`` (prefill), ``npu_incre_flash_attention``
(decode) and ``npu_fused_infer_attention_score`` (either), on npu_fusion_attention's core.

``atten_out = softmax(scale_value * q @ k^T, masked) @ v`` with ``atten_mask`` True (or 1)
masking out, for layouts BSH, BSND, BNSD (and, for the prompt one, BNSD_BSND: BNSD in, BSND
out), grouped-query attention through ``num_key_value_heads``. ``actual_seq_lengths`` (prompt:
query lengths; incre: key/value lengths) and ``actual_seq_lengths_kv`` mask each batch's tail
(rows past a query length give zeros). The prompt operator's ``sparse_mode`` 0-4 and
pre/next_tokens act as in npu_fusion_attention. Quantized and paged (block_table) variants need
a compiled kernel and raise NotImplementedError.
"""
from __future__ import annotations

import torch

from ._common import NoKernel, check
from .attention import _attend, _band, _BIG, _from_bnsd, _to_bnsd


def _no_quant(op: str, **named) -> None:
    given = [n for n, v in named.items() if v is not None]
    if given:
        raise NoKernel(f"{op}: {', '.join(given)} (quantized / paged attention) need a compiled "
                       "CANN kernel, which npusim does not have")


def _lengths(name: str, vals, b: int, full: int, op: str) -> list:
    if vals is None:
        return [full] * b
    vals = [int(v) for v in (vals.tolist() if isinstance(vals, torch.Tensor) else vals)]
    check(len(vals) == 1 or len(vals) >= b, op, f"{name} needs 1 or >= {b} entries, got "
          f"{len(vals)}")
    vals = vals * b if len(vals) == 1 else vals[:b]
    check(all(0 <= v <= full for v in vals), op, f"{name} {vals} must lie in [0, {full}]")
    return vals


def _user_mask(atten_mask, b: int, sq: int, skv: int, op: str):
    m = atten_mask if atten_mask.dtype == torch.bool else atten_mask != 0
    check(tuple(m.shape[-2:]) == (sq, skv) or (m.shape[-2] >= sq and m.shape[-1] >= skv), op,
          f"atten_mask of shape {tuple(m.shape)} does not cover (Q_S, KV_S) = ({sq}, {skv})")
    m = m[..., :sq, :skv]
    if m.dim() == 3:                       # (B, Q_S, KV_S) / (1, Q_S, KV_S)
        m = m.unsqueeze(1)
    return ~m


def _run(op, query, key, value, num_heads, num_key_value_heads, scale_value, layout, keep_fn):
    in_layout, out_layout = (("BNSD", "BSND") if layout == "BNSD_BSND" else (layout, layout))
    check(in_layout in ("BSH", "BSND", "BNSD"), op, f"input_layout must be BSH, BSND, BNSD or "
          f"BNSD_BSND, got {layout!r}")
    nkv = num_key_value_heads or num_heads
    check(num_heads % nkv == 0, op, f"num_heads={num_heads} is not a multiple of "
          f"num_key_value_heads={nkv}")
    q = _to_bnsd(query, in_layout, num_heads)
    k = _to_bnsd(key, in_layout, nkv)
    v = _to_bnsd(value, in_layout, nkv)
    check(q.size(1) == num_heads and k.size(1) == nkv, op, f"num_heads={num_heads} / "
          f"num_key_value_heads={nkv} do not match the inputs' heads {q.size(1)} / {k.size(1)}")
    b, _, sq, _ = q.shape
    keep = keep_fn(b, sq, k.size(2))
    out, m, total = _attend(q, k, v, keep, None, float(scale_value), None, 1.0)
    return _from_bnsd(out, out_layout), m, total


def _seq_keep(b, sq, skv, qlens, kvlens, device):
    rows = torch.arange(sq).view(1, 1, sq, 1) < torch.as_tensor(qlens).view(b, 1, 1, 1)
    cols = torch.arange(skv).view(1, 1, 1, skv) < torch.as_tensor(kvlens).view(b, 1, 1, 1)
    return (rows & cols).to(device)


def _prompt_keep(op, device, atten_mask, sparse_mode, pre_tokens, next_tokens, qlens, kvlens,
                 pse_shift):
    """The keep-mask builder of the prompt operators: sequence lengths, then sparse_mode."""
    check(pse_shift is None, op, "pse_shift is not supported on npusim")
    check(sparse_mode in (0, 1, 2, 3, 4), op, f"sparse_mode must be 0-4, got {sparse_mode}")

    def keep_fn(b, sq, skv):
        keep = _seq_keep(b, sq, skv, _lengths("actual_seq_lengths", qlens, b, sq, op),
                         _lengths("actual_seq_lengths_kv", kvlens, b, skv, op), device)
        if atten_mask is None:
            return keep
        off = skv - sq
        geometry = {2: (_BIG, 0, 0), 3: (_BIG, 0, off), 4: (pre_tokens, next_tokens, off)}
        if sparse_mode in geometry:
            return keep & _band(sq, skv, *geometry[sparse_mode]).to(device)
        keep = keep & _user_mask(atten_mask, b, sq, skv, op)
        if sparse_mode == 0 and (pre_tokens < max(sq, skv) or next_tokens < max(sq, skv)):
            keep = keep & _band(sq, skv, pre_tokens, next_tokens, 0).to(device)
        return keep
    return keep_fn


def npu_prompt_flash_attention(query, key, value, *, pse_shift=None, padding_mask=None,
                               atten_mask=None, actual_seq_lengths=None, deq_scale1=None,
                               quant_scale1=None, deq_scale2=None, quant_scale2=None,
                               quant_offset2=None, num_heads=1, scale_value=1.0,
                               pre_tokens=2147483647, next_tokens=0, input_layout="BSH",
                               num_key_value_heads=0, actual_seq_lengths_kv=None, sparse_mode=0):
    """torch_npu.npu_prompt_flash_attention -> attention_out (module docstring)."""
    op = "npu_prompt_flash_attention"
    _no_quant(op, deq_scale1=deq_scale1, quant_scale1=quant_scale1, deq_scale2=deq_scale2,
              quant_scale2=quant_scale2, quant_offset2=quant_offset2)
    return _run(op, query, key, value, num_heads, num_key_value_heads, scale_value, input_layout,
                _prompt_keep(op, query.device, atten_mask, sparse_mode, pre_tokens, next_tokens,
                             actual_seq_lengths, actual_seq_lengths_kv, pse_shift))[0]


def npu_incre_flash_attention(query, key, value, *, padding_mask=None, pse_shift=None,
                              atten_mask=None, actual_seq_lengths=None, dequant_scale1=None,
                              quant_scale1=None, dequant_scale2=None, quant_scale2=None,
                              quant_offset2=None, antiquant_scale=None, antiquant_offset=None,
                              block_table=None, kv_padding_size=None, num_heads=1,
                              scale_value=1.0, input_layout="BSH", num_key_value_heads=0,
                              block_size=0, inner_precise=1):
    """torch_npu.npu_incre_flash_attention -> attention_out, shaped like query (decode step:
    query S = 1; ``actual_seq_lengths`` are the key/value lengths per batch)."""
    op = "npu_incre_flash_attention"
    _no_quant(op, dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
              dequant_scale2=dequant_scale2, quant_scale2=quant_scale2,
              quant_offset2=quant_offset2, antiquant_scale=antiquant_scale,
              antiquant_offset=antiquant_offset, block_table=block_table,
              kv_padding_size=kv_padding_size)
    check(pse_shift is None, op, "pse_shift is not supported on npusim")

    def keep_fn(b, sq, skv):
        keep = _seq_keep(b, sq, skv, [sq] * b,
                         _lengths("actual_seq_lengths", actual_seq_lengths, b, skv, op),
                         query.device)
        if atten_mask is not None:
            keep = keep & _user_mask(atten_mask, b, sq, skv, op)
        return keep
    return _run(op, query, key, value, num_heads, num_key_value_heads, scale_value, input_layout,
                keep_fn)[0]


def npu_fused_infer_attention_score(
        query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
        actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None, dequant_scale2=None,
        quant_scale2=None, quant_offset2=None, antiquant_scale=None, antiquant_offset=None,
        block_table=None, query_padding_size=None, kv_padding_size=None,
        key_antiquant_scale=None, key_antiquant_offset=None, value_antiquant_scale=None,
        value_antiquant_offset=None, key_shared_prefix=None, value_shared_prefix=None,
        actual_shared_prefix_len=None, query_rope=None, key_rope=None,
        key_rope_antiquant_scale=None, num_heads=1, scale=1.0, pre_tokens=2147483647,
        next_tokens=2147483647, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
        inner_precise=0, block_size=0, antiquant_mode=0, softmax_lse_flag=False,
        key_antiquant_mode=0, value_antiquant_mode=0):
    """torch_npu.npu_fused_infer_attention_score -> (attention_out, softmax_lse): the prompt
    operator's semantics (any query length), and with ``softmax_lse_flag`` the float32
    log-sum-exp of each row's scaled scores, (B, N, Q_S, 1) (empty otherwise). Quantized,
    paged, shared-prefix, padding-size and rope-split inputs need a compiled kernel."""
    op = "npu_fused_infer_attention_score"
    _no_quant(op, dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
              dequant_scale2=dequant_scale2, quant_scale2=quant_scale2,
              quant_offset2=quant_offset2, antiquant_scale=antiquant_scale,
              antiquant_offset=antiquant_offset, block_table=block_table,
              query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
              key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
              value_antiquant_scale=value_antiquant_scale,
              value_antiquant_offset=value_antiquant_offset, key_shared_prefix=key_shared_prefix,
              value_shared_prefix=value_shared_prefix,
              actual_shared_prefix_len=actual_shared_prefix_len, query_rope=query_rope,
              key_rope=key_rope, key_rope_antiquant_scale=key_rope_antiquant_scale)
    out, m, total = _run(op, query, key, value, num_heads, num_key_value_heads, scale,
                         input_layout,
                         _prompt_keep(op, query.device, atten_mask, sparse_mode, pre_tokens,
                                      next_tokens, actual_seq_lengths, actual_seq_lengths_kv,
                                      pse_shift))
    if not softmax_lse_flag:
        return out, torch.empty(0, dtype=torch.float32, device=query.device)
    return out, (m + torch.log(total)).unsqueeze(-1)
