"""Mixture-of-experts operators: ``npu_grouped_matmul``, ``npu_moe_token_permute`` /
``npu_moe_token_unpermute``, ``npu_moe_gating_top_k_softmax``, ``npu_moe_compute_expert_tokens``.

``npu_grouped_matmul`` computes ``y_i = act(x_i @ weight_i + bias_i)`` for each group i (the
non-quantized formula of torch_npu's docstring). Groups come from ``weight`` (a list of (k, n)
matrices, or one (g, k, n) tensor) and, when x is one tensor, ``group_list`` splits its rows: a
list or (``group_list_type=0``) tensor of cumulative ends, or (``group_list_type=1``) a tensor of
group sizes. ``split_item`` 0/1 returns one tensor per group, 2/3 one tensor of the groups' rows
concatenated; ``group_type=2`` groups the K axis instead (the weight gradient of a grouped
matmul: ``x[:, a:b] @ weight[a:b]`` per group, stacked). Quantized variants (int8/int4/fp8
weights, scale, offset, antiquant_*, per_token_scale) need a compiled kernel and raise
NotImplementedError.

Token permutation follows the semantics its docstring example shows (Megatron's permute):
``sorted_indices = argsort(indices.flatten(), stable)``, row j of the permuted tokens is
``tokens[sorted_indices[j] // topk]`` (the first ``num_out_tokens`` of them); unpermute scatters
the rows back to their (token, k) slots, weights them with ``probs`` and sums over k.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import NoKernel, check, compute_dtype

_ACTS = {0: None, 1: F.relu, 2: lambda t: F.gelu(t, approximate="tanh"),
         4: lambda t: t * torch.sigmoid(1.702 * t), 5: F.silu}
_QUANT = (torch.int8, torch.int32, torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2)


def _ends(group_list, group_list_type: int, op: str) -> list:
    if isinstance(group_list, torch.Tensor):
        check(group_list_type in (0, 1), op, f"group_list_type must be 0 (cumulative) or 1 "
              f"(sizes), got {group_list_type}")
        vals = [int(v) for v in group_list.tolist()]
        if group_list_type == 1:
            out, acc = [], 0
            for v in vals:
                acc += v
                out.append(acc)
            return out
        return vals
    vals = [int(v) for v in group_list]
    check(all(b >= a for a, b in zip([0] + vals, vals)), op, f"group_list {vals} must be "
          "non-negative and non-decreasing (cumulative ends)")
    return vals


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None,
                       activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item=0, group_type=None,
                       group_list_type=0, act_type=0, tuning_config=None, output_dtype=None,
                       x_dtype=None, weight_dtype=None, scale_dtype=None,
                       per_token_scale_dtype=None):
    """torch_npu.npu_grouped_matmul -> List[Tensor] (module docstring)."""
    op = "npu_grouped_matmul"
    x, weight = list(x), list(weight)
    check(len(x) > 0 and len(weight) > 0, op, "x and weight must be non-empty lists")
    quant = [n for n, v in (("scale", scale), ("offset", offset), ("antiquant_scale",
             antiquant_scale), ("antiquant_offset", antiquant_offset), ("per_token_scale",
             per_token_scale), ("x_dtype", x_dtype), ("weight_dtype", weight_dtype))
             if v is not None]
    if quant or x[0].dtype in _QUANT or weight[0].dtype in _QUANT:
        raise NoKernel(f"{op}: the quantized variant ({', '.join(quant) or x[0].dtype}) needs "
                       "a compiled CANN kernel, which npusim does not have")
    check(split_item in (0, 1, 2, 3), op, f"split_item must be 0-3, got {split_item}")
    check(act_type in _ACTS, op, f"act_type must be 0, 1, 2, 4 or 5, got {act_type}")
    if group_type == 2:
        return _k_grouped(x, weight, group_list, group_list_type, split_item, output_dtype, op)
    ws = list(weight[0].unbind(0)) if len(weight) == 1 and weight[0].dim() == 3 else weight
    check(all(w.dim() == 2 for w in ws), op, "each weight must be a (k, n) matrix or weight "
          "one (g, k, n) tensor")
    if group_list is not None and len(x) == 1:
        ends = _ends(group_list, group_list_type, op)
        check(len(ends) == len(ws), op, f"group_list has {len(ends)} groups, weight {len(ws)}")
        check(x[0].dim() == 2 and ends[-1] <= x[0].size(0), op, f"group_list ends at {ends[-1]}"
              f" beyond x's {x[0].size(0)} rows")
        xs = [x[0][a:b] for a, b in zip([0] + ends[:-1], ends)]
    else:
        check(len(x) == len(ws), op, f"{len(x)} x tensors for {len(ws)} weights")
        xs = x
    if bias is not None:
        bias = list(bias)
        check(len(bias) == len(ws), op, f"{len(bias)} biases for {len(ws)} weights")
    act = _ACTS[act_type]
    dtype = output_dtype or x[0].dtype
    ys = []
    for i, (xi, wi) in enumerate(zip(xs, ws)):
        check(xi.size(-1) == wi.size(0), op, f"group {i}: x has k={xi.size(-1)}, weight "
              f"{wi.size(0)}")
        ct = compute_dtype(xi.dtype)
        y = torch.matmul(xi.to(ct), wi.to(ct))
        if bias is not None:
            y = y + bias[i].to(ct)
        ys.append((act(y) if act else y).to(dtype))
    if split_item in (0, 1):
        return ys
    y = torch.cat(ys, dim=0)
    rows = sum(t.size(0) for t in x)
    if y.size(0) < rows:    # a tensor group_list may end before x does: those rows are zeros
        y = torch.cat((y, y.new_zeros(rows - y.size(0), y.size(1))), dim=0)
    return [y]


def _k_grouped(x, weight, group_list, group_list_type, split_item, output_dtype, op):
    """group_type=2: the K axis is grouped (a grouped weight gradient, ``x_i^T @ dy_i``): x is
    (M, K), weight (K, N); group i gives ``x[:, a:b] @ weight[a:b]``, stacked to (g, M, N) for
    split_item 2/3."""
    check(len(x) == 1 and len(weight) == 1 and x[0].dim() == 2 and weight[0].dim() == 2, op,
          "group_type=2 takes one (M, K) x and one (K, N) weight")
    check(group_list is not None, op, "group_type=2 needs group_list")
    xm, w = x[0], weight[0]
    check(xm.size(1) == w.size(0), op, f"x has K={xm.size(1)}, weight {w.size(0)}")
    ends = _ends(group_list, group_list_type, op)
    ct = compute_dtype(xm.dtype)
    ys = [(xm[:, a:b].to(ct) @ w[a:b].to(ct)).to(output_dtype or xm.dtype)
          for a, b in zip([0] + ends[:-1], ends)]
    return ys if split_item in (0, 1) else [torch.stack(ys)]


def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """torch_npu.npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False)
    -> (permuted_tokens, sorted_indices int32)."""
    op = "npu_moe_token_permute"
    check(tokens.dim() == 2, op, f"tokens must be 2-d (num_tokens, hidden), got {tokens.dim()}-d")
    check(indices.dim() in (1, 2), op, f"indices must be 1-d or 2-d, got {indices.dim()}-d")
    if padded_mode:
        raise NotImplementedError(f"{op}: padded_mode=True is not supported (nor by the real "
                                  "operator)")
    topk = 1 if indices.dim() == 1 else indices.size(1)
    flat = indices.reshape(-1)
    n = int(num_out_tokens or 0)
    keep = min(n, flat.numel()) if n > 0 else flat.numel() + n
    sorted_indices = torch.argsort(flat, stable=True)
    permuted = tokens.index_select(0, torch.div(sorted_indices[:keep], topk,
                                                rounding_mode="floor"))
    return permuted, sorted_indices.to(torch.int32)


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                            restore_shape=None):
    """torch_npu.npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None,
    padded_mode=False, restore_shape=None) -> (num_tokens, hidden) tensor."""
    op = "npu_moe_token_unpermute"
    check(permuted_tokens.dim() == 2, op, f"permuted_tokens must be 2-d, got "
          f"{permuted_tokens.dim()}-d")
    check(sorted_indices.dim() == 1, op, f"sorted_indices must be 1-d, got "
          f"{sorted_indices.dim()}-d")
    if padded_mode:
        raise NotImplementedError(f"{op}: padded_mode=True is not supported (nor by the real "
                                  "operator)")
    topk = 1 if probs is None else probs.size(1)
    slots = sorted_indices.numel()
    check(slots % topk == 0, op, f"{slots} sorted_indices do not split into topk={topk}")
    rows = permuted_tokens.size(0)
    check(rows <= slots, op, f"{rows} permuted rows for {slots} sorted_indices")
    h = permuted_tokens.size(1)
    ct = compute_dtype(permuted_tokens.dtype)
    idx = sorted_indices[:rows].long()
    buf = permuted_tokens.new_zeros(slots, h, dtype=ct).index_copy(0, idx, permuted_tokens.to(ct))
    buf = buf.view(slots // topk, topk, h)
    if probs is not None:
        check(probs.dim() == 2 and probs.size(0) * topk == slots, op, f"probs of shape "
              f"{tuple(probs.shape)} does not match {slots} sorted_indices")
        buf = buf * probs.to(ct).unsqueeze(-1)
    return buf.sum(dim=1).to(permuted_tokens.dtype)


def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    """torch_npu.npu_moe_gating_top_k_softmax(x, finished=None, k=1) -> (y, expert_idx, row_idx):
    the top-k of softmax(x, -1), their expert indices (int32; ``num_experts`` for rows that
    ``finished`` marks done) and ``row_idx[r, j] = j * rows + r`` (int32), the source-row index
    npu_moe_init_routing takes."""
    op = "npu_moe_gating_top_k_softmax"
    check(x.dim() in (2, 3), op, f"x must be 2-d or 3-d, got {x.dim()}-d")
    e = x.size(-1)
    check(0 < k <= e, op, f"k must be in (0, {e}], got {k}")
    p = torch.softmax(x.to(compute_dtype(x.dtype)), dim=-1)
    y, idx = torch.topk(p, k, dim=-1)
    idx = idx.to(torch.int32)
    if finished is not None:
        check(tuple(finished.shape) == tuple(x.shape[:-1]), op, f"finished must have shape "
              f"{tuple(x.shape[:-1])}, got {tuple(finished.shape)}")
        idx = torch.where(finished.bool().unsqueeze(-1), torch.full_like(idx, e), idx)
    rows = x.numel() // e
    row_idx = torch.arange(k * rows, dtype=torch.int32).view(k, rows).t()
    return y.to(x.dtype), idx, row_idx.reshape(*x.shape[:-1], k).to(x.device)


def npu_moe_compute_expert_tokens(sorted_experts, num_experts=1):
    """torch_npu.npu_moe_compute_expert_tokens(sorted_experts, num_experts) -> int32 (E,): for
    each expert e the end of its run in the sorted expert list (count of entries <= e)."""
    bounds = torch.arange(num_experts, device=sorted_experts.device,
                          dtype=sorted_experts.dtype)
    return torch.searchsorted(sorted_experts.contiguous(), bounds, right=True).to(torch.int32)


def npu_moe_init_routing(x, row_idx, expert_idx, active_num):
    """torch_npu.npu_moe_init_routing(x, row_idx, expert_idx, active_num) -> (expanded_x,
    expanded_row_idx, expanded_expert_idx), its docstring's formula: (expert, row) pairs sorted
    by expert then row index; ``expanded_row_idx[sorted_row[i]] = i``;
    ``expanded_x[i] = x[sorted_row[i] % rows]`` for the first min(rows, active_num) * k."""
    op = "npu_moe_init_routing"
    check(x.dim() == 2, op, f"x must be 2-d (rows, H), got {x.dim()}-d")
    check(expert_idx.dim() == 2 and row_idx.shape == expert_idx.shape, op, "row_idx and "
          "expert_idx must both be (rows, k)")
    rows, k = expert_idx.shape
    experts, srcs = expert_idx.reshape(-1).long(), row_idx.reshape(-1).long()
    order = torch.argsort(experts * (rows * k) + srcs, stable=True)
    sorted_row = srcs[order]
    expanded_row_idx = torch.empty_like(sorted_row).scatter_(
        0, sorted_row, torch.arange(rows * k, device=sorted_row.device))
    n = min(rows, int(active_num)) * k
    # sorted_row % rows, spelled without aten.remainder: on npu tensors torch.remainder(t, int)
    # currently fails in the device's fallback (the scalar reaches remainder.Tensor as an int)
    src = sorted_row[:n] - torch.div(sorted_row[:n], rows, rounding_mode="floor") * rows
    expanded_x = x.index_select(0, src)
    return (expanded_x, expanded_row_idx.to(torch.int32), experts[order].to(torch.int32))


def npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales,
                             expanded_src_to_dst_row, export_for_source_row, drop_pad_mode=0,
                             k=1):
    """torch_npu.npu_moe_finalize_routing -> (rows, H): ``skip1 + skip2 + sum_k scales[i, k] *
    (expanded_permuted_rows[expanded_src_to_dst_row[i + k * rows]] + bias[expert[i, k]])``."""
    op = "npu_moe_finalize_routing"
    if drop_pad_mode not in (0, None):
        raise NotImplementedError(f"{op}: drop_pad_mode={drop_pad_mode} is not supported on "
                                  "npusim (only 0, dropless)")
    check(skip1 is not None or skip2 is None, op, "skip2 needs skip1")
    k = scales.size(1) if scales is not None else int(k)
    rows = expanded_src_to_dst_row.numel() // k
    ct = compute_dtype(expanded_permuted_rows.dtype)
    picked = expanded_permuted_rows.to(ct).index_select(
        0, expanded_src_to_dst_row.long()).view(k, rows, -1)            # [k, rows, H]
    if bias is not None:
        check(export_for_source_row is not None, op, "bias needs export_for_source_row")
        picked = picked + bias.to(ct)[export_for_source_row.long().t()]
    weights = scales.to(ct).t().unsqueeze(-1) if scales is not None else 1.0
    out = (picked * weights).sum(dim=0)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.to(ct)
    return out.to(expanded_permuted_rows.dtype)


def npu_moe_token_permute_with_routing_map(tokens, routing_map, *, probs=None,
                                           num_out_tokens=None, drop_and_pad=False):
    """torch_npu.npu_moe_token_permute_with_routing_map -> (permuted_tokens, permuted_probs,
    sorted_indices int32): tokens grouped by expert (expert-major, tokens in order within an
    expert) from the (tokens, experts) routing_map; sorted_indices holds each row's token."""
    op = "npu_moe_token_permute_with_routing_map"
    if drop_and_pad:
        raise NotImplementedError(f"{op}: drop_and_pad=True is not supported on npusim")
    check(tokens.dim() == 2 and routing_map.dim() == 2 and
          routing_map.size(0) == tokens.size(0), op, "tokens (T, H) and routing_map (T, E) "
          "must share T")
    mask = routing_map.bool().t()                                    # (E, T)
    token_ids = torch.arange(tokens.size(0), device=tokens.device).expand_as(mask)
    sorted_indices = token_ids.masked_select(mask)
    if num_out_tokens is not None:
        sorted_indices = sorted_indices[:int(num_out_tokens)]
    permuted = tokens.index_select(0, sorted_indices)
    permuted_probs = None
    if probs is not None:
        permuted_probs = probs.t().masked_select(mask)[:sorted_indices.numel()]
    return permuted, permuted_probs, sorted_indices.to(torch.int32)


def npu_moe_token_unpermute_with_routing_map(permuted_tokens, sorted_indices, restore_shape, *,
                                             probs=None, routing_map=None, drop_and_pad=False):
    """torch_npu.npu_moe_token_unpermute_with_routing_map -> restore_shape tensor: each permuted
    row (weighted by its probs entry, picked expert-major through routing_map) added back to
    its token; index -1 is an empty slot."""
    op = "npu_moe_token_unpermute_with_routing_map"
    if drop_and_pad:
        raise NotImplementedError(f"{op}: drop_and_pad=True is not supported on npusim")
    ct = compute_dtype(permuted_tokens.dtype)
    rows = permuted_tokens.to(ct)
    if probs is not None:
        check(routing_map is not None, op, "probs needs routing_map")
        weights = probs.t().masked_select(routing_map.bool().t()).to(ct)
        rows = rows * weights[:rows.size(0)].unsqueeze(-1)
    idx = sorted_indices.long()
    valid = idx >= 0
    if not bool(valid.all()):
        rows, idx = rows[valid], idx[valid]
    out = rows.new_zeros(tuple(int(s) for s in restore_shape)).index_add(0, idx, rows)
    return out.to(permuted_tokens.dtype)


def npu_grouped_matmul_add_(y, x1, x2, group_list, *, transpose_x=True, transpose_weight=False,
                            group_type=2, group_list_type=0):
    """torch_npu.npu_grouped_matmul_add_(y, x, dy, group_list) -> y, adding each group's
    ``x[a:b]^T @ dy[a:b]`` (a grouped weight gradient, K grouped: group_type 2) into y viewed as
    (groups, M, N), in place (MindSpeed accumulates main_grad with it)."""
    op = "npu_grouped_matmul_add_"
    check(group_type == 2, op, f"group_type only supports 2, got {group_type}")
    a = x1.t() if transpose_x else x1                                # (M, K)
    b = x2.t() if transpose_weight else x2                           # (K, N)
    ends = _ends(group_list, group_list_type, op)
    view = y.view(len(ends), a.size(0), b.size(1))
    with torch.no_grad():
        for i, (s, e) in enumerate(zip([0] + ends[:-1], ends)):
            view[i] += (a[:, s:e].to(compute_dtype(a.dtype)) @
                        b[s:e].to(compute_dtype(b.dtype))).to(y.dtype)
    return y
