"""``npu_fusion_attention`` and ``npu_fusion_attention_grad``: Ascend's FlashAttention for
training, as plain torch operators.

Semantics (torch_npu 2.14's docstring and meta registration):
``attention = Dropout(Softmax(Mask(scale * (pse + q @ k^T), atten_mask)), keep_prob) @ v``,
for q/k/v in the layouts BSH, SBH, BSND, BNSD, and TND (varlen: the sequences packed along T,
``actual_seq_qlen`` / ``actual_seq_kvlen`` their cumulative ends). ``atten_mask`` True means
*masked out*. Which positions are computed is decided by ``sparse_mode``:

====  ==============================================================================
0     ``atten_mask`` as given (BNSS/B1SS/11SS/SS), and the band ``-pre_tockens <= j - i <=
      next_tockens`` counted from the top-left corner
1     ``atten_mask`` as given, tokens ignored
2     causal from the top-left: ``j <= i`` (the mask passed is the compressed 2048x2048 one; its
      contents are not read)
3     causal from the bottom-right: ``j - i <= Skv - Sq``
4     band counted from the bottom-right: ``-pre_tockens <= j - i - (Skv - Sq) <= next_tockens``
5     prefix, uncompressed: ``atten_mask`` (BNSS/B1SS) as given
6     prefix, compressed: mode 3 plus the first ``prefix[b]`` keys of batch b
7, 8  varlen split across cards (TND only): mode 3 (7) / mode 2 (8) for every sequence but the
      last (7) / first (8), which is the band of mode 4
====  ==============================================================================

With ``atten_mask=None`` every position is computed whatever ``sparse_mode`` says (as the real
operator documents). A row with no computed position gives zeros (the kernel's "invalid row"
handling), not NaN. Scores, softmax and the value product are computed in float32 for half
inputs, as the kernel accumulates; the output has the query's dtype.

Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)``:
softmax_max / softmax_sum are the row maximum of the masked scaled scores and the row sum of
``exp(score - max)``, float32, repeated 8 times on a last axis: (B, N, Sq, 8); for TND, shape
(T, N, 8) holding (N, T, 8) in storage order by default ("NTD", as the kernel stores it:
``.view(N, T, 8)`` reads it) and (T, N, 8) in order with ``softmax_layout="TND"``; softmax_out is
an empty tensor
(reserved by the real operator). Dropout (``keep_prob < 1``) draws ``seed`` from the device's
generator (``torch.npu.manual_seed`` makes it reproducible); the keep-mask is a function of the
seed only, so ``npu_fusion_attention_grad`` given the same seed redraws it. ``offset`` is 0 and
``numels`` the number of mask elements (0 without dropout).

Autograd: the composition differentiates itself (dq, dk, dv, dpse);
``npu_fusion_attention_grad`` recomputes the forward and returns ``(dq, dk, dv, dpse, dsink)``.
"""
from __future__ import annotations

import operator

import torch

from ._common import check, compute_dtype, draw_seed, uniform

OP = "npu_fusion_attention"
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
_BIG = 2147483647


def _lens(name: str, cum) -> list:
    """Per-sequence (start, end) from torch_npu's cumulative ends; a value below the previous
    one (the trailing zeros of batches that do not take part) is an empty sequence."""
    if isinstance(cum, torch.Tensor):
        cum = cum.tolist()
    spans, prev = [], 0
    for c in cum:
        c = int(c)
        check(c >= 0, OP, f"{name} holds a negative length {c}")
        if c < prev:
            spans.append((prev, prev))
        else:
            spans.append((prev, c))
            prev = c
    return spans


def _heads(q, k, v, head_num: int, layout: str):
    """(Nq, Nkv, D, Dv) of the inputs in ``layout``."""
    if layout in ("BSH", "SBH"):
        check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, OP,
              f"input_layout {layout} needs 3-d query/key/value, got {q.dim()}/{k.dim()}/{v.dim()}")
        check(q.size(2) % head_num == 0, OP, f"query's H={q.size(2)} is not a multiple of "
              f"head_num={head_num}")
        d = q.size(2) // head_num
        check(d > 0 and k.size(2) % d == 0, OP, f"key's H={k.size(2)} is not a multiple of the "
              f"head dim {d}")
        nkv = k.size(2) // d
        check(nkv > 0 and v.size(2) % nkv == 0, OP, f"value's H={v.size(2)} does not split into "
              f"{nkv} heads")
        return head_num, nkv, d, v.size(2) // nkv
    nd = 3 if layout == "TND" else 4
    check(q.dim() == nd and k.dim() == nd and v.dim() == nd, OP, f"input_layout {layout} needs "
          f"{nd}-d query/key/value, got {q.dim()}/{k.dim()}/{v.dim()}")
    ax = 1 if layout == "BNSD" else nd - 2
    check(q.size(ax) == head_num, OP, f"head_num={head_num} but query has {q.size(ax)} heads "
          f"in layout {layout}")
    return head_num, k.size(ax), q.size(-1), v.size(-1)


def _to_bnsd(x, layout: str, n: int):
    if layout == "BSH":
        return x.reshape(x.size(0), x.size(1), n, -1).transpose(1, 2)
    if layout == "SBH":
        return x.reshape(x.size(0), x.size(1), n, -1).permute(1, 2, 0, 3)
    if layout == "BSND":
        return x.transpose(1, 2)
    return x


def _from_bnsd(o, layout: str):
    b, n, s, d = o.shape
    if layout == "BSH":
        return o.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        return o.permute(2, 0, 1, 3).reshape(s, b, n * d)
    if layout == "BSND":
        return o.transpose(1, 2)
    return o


def _band(sq: int, skv: int, pre: int, nxt: int, origin: int) -> torch.Tensor:
    """Keep where ``-pre <= j - i - origin <= nxt`` (origin 0: top-left, Skv-Sq: bottom-right)."""
    d = torch.arange(skv).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - origin
    return (d >= -pre) & (d <= nxt)


def _given(atten_mask, sq: int, skv: int, varlen: bool) -> torch.Tensor:
    m = atten_mask if atten_mask.dtype == torch.bool else atten_mask != 0
    if varlen:      # varlen takes an SS mask of (max Sq, max Skv): each sequence its corner
        check(m.dim() == 2 and m.size(0) >= sq and m.size(1) >= skv, OP,
              f"atten_mask of shape {tuple(m.shape)} does not cover a sequence of Sq={sq}, "
              f"Skv={skv} (TND takes an SS mask of the longest lengths)")
        return ~m[:sq, :skv]
    check(m.dim() in (2, 4) and tuple(m.shape[-2:]) == (sq, skv), OP,
          f"atten_mask must be BNSS, B1SS, 11SS or SS with SS = ({sq}, {skv}), got "
          f"{tuple(m.shape)}")
    return ~m


def _keep(mode: int, atten_mask, sq: int, skv: int, pre: int, nxt: int, prefix, varlen: bool,
          device):
    """The positions computed, broadcastable to (B, N, Sq, Skv), or None for all of them."""
    if atten_mask is None:
        return None
    off = skv - sq
    if mode in (0, 1, 5):
        keep = _given(atten_mask, sq, skv, varlen)
        if mode == 0 and (pre < max(sq, skv) or nxt < max(sq, skv)):
            keep = keep & _band(sq, skv, pre, nxt, 0).to(keep.device)
        return keep
    if mode == 2:
        keep = _band(sq, skv, _BIG, 0, 0)
    elif mode == 3:
        keep = _band(sq, skv, _BIG, 0, off)
    elif mode == 4:
        keep = _band(sq, skv, pre, nxt, off)
    elif mode == 6:
        check(prefix is not None, OP, "sparse_mode=6 needs prefix (one N per batch)")
        cols = torch.arange(skv).view(1, 1, 1, skv)
        n = torch.as_tensor([int(p) for p in prefix]).view(-1, 1, 1, 1)
        keep = _band(sq, skv, _BIG, 0, off) | (cols < n)
    else:
        raise ValueError(f"{OP}: sparse_mode={mode} is not one of 0-8 (7 and 8 need TND)")
    return keep.to(device)


def _attend(q, k, v, keep, pse, scale: float, drop, keep_prob: float):
    """BNSD attention; returns (out in q's dtype, row max, row sum) with float32 statistics."""
    ct = compute_dtype(q.dtype)
    nq, nkv = q.size(1), k.size(1)
    if nq != nkv:
        check(nkv > 0 and nq % nkv == 0, OP, f"query heads {nq} are not a multiple of key/value "
              f"heads {nkv} (grouped-query attention needs Nq/Nkv integral)")
        k = k.repeat_interleave(nq // nkv, dim=1)
        v = v.repeat_interleave(nq // nkv, dim=1)
    s = torch.matmul(q.to(ct), k.to(ct).transpose(-1, -2))
    if pse is not None:
        s = s + pse.to(ct)
    s = s * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    m = s.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    if drop is not None:
        p = p * drop.to(ct) / keep_prob
    out = torch.matmul(p, v.to(ct)).to(q.dtype)
    empty = total.detach() == 0
    stat_max = torch.where(empty, torch.full_like(m, torch.finfo(torch.float32).min), m)
    return out, stat_max.squeeze(-1).float(), total.detach().squeeze(-1).float()


def _stats8(t):
    return t.unsqueeze(-1).expand(*t.shape, 8).contiguous()


def _forward(query, key, value, head_num, input_layout, pse, atten_mask, scale, keep_prob,
             pre_tockens, next_tockens, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
             softmax_layout, seed):
    """Everything but drawing the seed: (out, softmax_max, softmax_sum, numels)."""
    check(input_layout in LAYOUTS, OP, f"input_layout must be one of {LAYOUTS}, got "
          f"{input_layout!r}")
    try:
        head_num = operator.index(head_num)
    except TypeError:
        head_num = None
    check(head_num is not None and head_num > 0, OP, "head_num must be a positive int")
    check(0 < keep_prob <= 1, OP, f"keep_prob must be in (0, 1], got {keep_prob}")
    check(query.dtype == key.dtype == value.dtype, OP, f"query, key and value must share a dtype "
          f"(got {query.dtype}, {key.dtype}, {value.dtype})")
    check(softmax_layout in ("", "TND"), OP, f"softmax_layout must be '' or 'TND', got "
          f"{softmax_layout!r}")
    check(sparse_mode not in (7, 8) or input_layout == "TND", OP,
          f"sparse_mode={sparse_mode} is for the varlen (TND) layout only")
    nq, nkv, d, dv = _heads(query, key, value, head_num, input_layout)
    dropping = keep_prob < 1.0
    if input_layout != "TND":
        q = _to_bnsd(query, input_layout, nq)
        k = _to_bnsd(key, input_layout, nkv)
        v = _to_bnsd(value, input_layout, nkv)
        check(k.size(0) == q.size(0), OP, f"batch of key {k.size(0)} != batch of query {q.size(0)}")
        b, _, sq, _ = q.shape
        skv = k.size(2)
        keep = _keep(sparse_mode, atten_mask, sq, skv, pre_tockens, next_tockens, prefix, False,
                     query.device)
        drop = uniform(seed, (b, nq, sq, skv), query.device) < keep_prob if dropping else None
        out, m, s = _attend(q, k, v, keep, pse, scale, drop, keep_prob)
        numels = b * nq * sq * skv if dropping else 0
        return _from_bnsd(out, input_layout), _stats8(m), _stats8(s), numels
    check(actual_seq_qlen is not None and actual_seq_kvlen is not None, OP,
          "input_layout TND needs actual_seq_qlen and actual_seq_kvlen (cumulative lengths)")
    check(pse is None, OP, "pse is not supported with input_layout TND on npusim")
    qs, ks = _lens("actual_seq_qlen", actual_seq_qlen), _lens("actual_seq_kvlen", actual_seq_kvlen)
    check(len(qs) == len(ks), OP, f"actual_seq_qlen has {len(qs)} entries, actual_seq_kvlen "
          f"{len(ks)}")
    check(qs[-1][1] <= query.size(0) and ks[-1][1] <= key.size(0), OP,
          f"actual_seq_qlen / actual_seq_kvlen end at {qs[-1][1]} / {ks[-1][1]} beyond T = "
          f"{query.size(0)} / {key.size(0)}")
    live = [i for i, ((a, b), (c, e)) in enumerate(zip(qs, ks)) if b > a]
    outs, maxes, sums, numels = [], [], [], 0
    for i, ((q0, q1), (k0, k1)) in enumerate(zip(qs, ks)):
        sq, skv = q1 - q0, k1 - k0
        if sq == 0:
            continue
        if skv == 0:
            outs.append(query.new_zeros(sq, nq, dv))
            maxes.append(torch.full((nq, sq), torch.finfo(torch.float32).min,
                                    device=query.device))
            sums.append(torch.zeros(nq, sq, device=query.device))
            continue
        mode, pre, nxt = sparse_mode, pre_tockens, next_tockens
        if mode == 7:
            mode = 4 if i == live[-1] else 3
        elif mode == 8:
            mode = 4 if i == live[0] else 2
        keep = _keep(mode, atten_mask, sq, skv, pre, nxt, None, True, query.device)
        q = query[q0:q1].transpose(0, 1).unsqueeze(0)
        k = key[k0:k1].transpose(0, 1).unsqueeze(0)
        v = value[k0:k1].transpose(0, 1).unsqueeze(0)
        drop = uniform(seed + i, (1, nq, sq, skv), query.device) < keep_prob if dropping else None
        numels += nq * sq * skv if dropping else 0
        o, m, s = _attend(q, k, v, keep, None, scale, drop, keep_prob)
        outs.append(o[0].transpose(0, 1))
        maxes.append(m[0])
        sums.append(s[0])
    tail = query.size(0) - sum(o.size(0) for o in outs)
    if tail:
        outs.append(query.new_zeros(tail, nq, dv))
        maxes.append(torch.full((nq, tail), torch.finfo(torch.float32).min, device=query.device))
        sums.append(torch.zeros(nq, tail, device=query.device))
    out = torch.cat(outs, dim=0)
    m, s = _stats8(torch.cat(maxes, dim=1)), _stats8(torch.cat(sums, dim=1))     # (N, T, 8)
    if softmax_layout == "TND":
        return out, m.transpose(0, 1).contiguous(), s.transpose(0, 1).contiguous(), numels
    # the default keeps NTD storage under the shape (T, N, 8) (the meta registration's shape)
    t = query.size(0)
    return out, m.view(t, nq, 8), s.view(t, nq, 8), numels


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1., keep_prob=1., pre_tockens=2147483647,
                         next_tockens=2147483647, inner_precise=0, prefix=None,
                         actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """torch_npu.npu_fusion_attention: FlashAttention for training (the module docstring).

    Returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels).
    Raises ValueError naming the argument on shapes, layouts or modes the real one rejects.
    """
    check(padding_mask is None, OP, "padding_mask is not supported (the real operator does not "
          "support it either)")
    if sink is not None:
        raise NotImplementedError(f"{OP}: sink is not supported on npusim")
    seed = draw_seed(query) if keep_prob < 1.0 else 0
    out, m, s, numels = _forward(query, key, value, head_num, input_layout, pse, atten_mask,
                                 float(scale), float(keep_prob), int(pre_tockens),
                                 int(next_tockens), prefix, actual_seq_qlen, actual_seq_kvlen,
                                 int(sparse_mode), softmax_layout, seed)
    return out, m, s, query.new_empty(0), seed, 0, numels


def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse=None,
                              padding_mask=None, atten_mask=None, softmax_max=None,
                              softmax_sum=None, softmax_in=None, attention_in=None,
                              scale_value=1., keep_prob=1., pre_tockens=2147483647,
                              next_tockens=2147483647, inner_precise=0, seed=0, offset=0,
                              numels=0, prefix=None, actual_seq_qlen=None,
                              actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                              sync=False, softmax_layout="", sink=None):
    """torch_npu.npu_fusion_attention_grad: the gradients of npu_fusion_attention's output.

    Recomputes the forward (softmax_max / softmax_sum / attention_in are accepted and not needed)
    with the forward's ``seed`` for its dropout mask. Returns (dq, dk, dv, dpse, dsink); dpse is
    an empty tensor without pse, dsink always empty.
    """
    if sink is not None:
        raise NotImplementedError(f"{OP}_grad: sink is not supported on npusim")
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        p = pse.detach().requires_grad_() if pse is not None else None
        out = _forward(q, k, v, head_num, input_layout, p, atten_mask, float(scale_value),
                       float(keep_prob), int(pre_tockens), int(next_tockens), prefix,
                       actual_seq_qlen, actual_seq_kvlen, int(sparse_mode), softmax_layout,
                       int(seed))[0]
        inputs = (q, k, v) + ((p,) if p is not None else ())
        grads = torch.autograd.grad(out, inputs, dy, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, inputs)]
    dpse = grads[3] if p is not None else query.new_empty(0)
    return grads[0], grads[1], grads[2], dpse, query.new_empty(0)
