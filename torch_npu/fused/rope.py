"""Rotary position embedding: ``npu_rotary_mul`` and ``npu_apply_rotary_pos_emb``.

``npu_rotary_mul(x, r1, r2, rotary_mode)`` is ``r1 * x + r2 * rotate(x)`` with r1 = cos, r2 = sin
broadcast against x (4-d: BNSD, BSND or SBND with r1 11SD / 1S1D / S11D or fuller):

- ``"half"``: ``rotate(x) = cat(-x[..., D/2:], x[..., :D/2])`` (rotate_half, Llama's),
- ``"interleave"``: pairs (x0, x1), (x2, x3)... become (-x1, x0), (-x3, x2)... (GPT-J's),
- ``rotate`` given: ``rotate(x) = x @ rotate`` (a D x D matrix the caller builds; no gradient
  flows into it, as in the real operator).

Autograd (x, r1, r2) comes from the composition.
"""
from __future__ import annotations

import torch

from ._common import check

MODES = ("half", "interleave")


def _rotated(x, mode: str, rotate, op: str):
    if rotate is not None:
        check(rotate.dim() == 2 and rotate.size(0) == rotate.size(1) == x.size(-1), op,
              f"rotate must be a {x.size(-1)}x{x.size(-1)} matrix, got {tuple(rotate.shape)}")
        return torch.matmul(x, rotate.detach().to(x.dtype))
    check(mode in MODES, op, f"rotary_mode must be one of {MODES}, got {mode!r}")
    check(x.size(-1) % 2 == 0, op, f"the last axis D={x.size(-1)} must be even")
    if mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def npu_rotary_mul(input, r1, r2, rotary_mode="half", rotate=None):
    """torch_npu.npu_rotary_mul(input, r1, r2, rotary_mode='half', rotate=None) -> Tensor."""
    check(input.dim() == 4, "npu_rotary_mul", f"input must be 4-d, got {input.dim()}-d")
    return r1 * input + r2 * _rotated(input, rotary_mode, rotate, "npu_rotary_mul")


def npu_apply_rotary_pos_emb(query, key, cos, sin, *, layout="BSND", rotary_mode="half"):
    """torch_npu.npu_apply_rotary_pos_emb -> (query, key), both updated in place (as the real
    operator does) with ``npu_rotary_mul``'s formula; layout BSND, SBND, BNSD (4-d) or TND (3-d),
    cos/sin broadcast against them."""
    op = "npu_apply_rotary_pos_emb"
    check(layout in ("BSND", "SBND", "BNSD", "TND"), op, f"layout must be BSND, SBND, BNSD or "
          f"TND, got {layout!r}")
    nd = 3 if layout == "TND" else 4
    check(query.dim() == nd and key.dim() == nd, op, f"layout {layout} needs {nd}-d query and key")
    if rotary_mode == "quarter":
        raise NotImplementedError(f"{op}: rotary_mode='quarter' is not supported on npusim")
    q = cos * query + sin * _rotated(query, rotary_mode, None, op)
    k = cos * key + sin * _rotated(key, rotary_mode, None, op)
    query.copy_(q)
    key.copy_(k)
    return query, key


def npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None,
              rotary_mode="half", cache_mode="default"):
    """torch_npu.npu_mrope(positions, query, key, cos_sin_cache, head_size, ...) -> (query, key).

    ``cos_sin_cache`` (max_len, rotary_dim) holds cos then sin (rotary_dim / 2 each); row
    ``positions[t]`` rotates token t's first rotary_dim channels of every head of the 2-d
    query / key (tokens, heads * head_size). With 2-d positions (3, tokens) and
    ``mrope_section`` [t, h, w] (multimodal rope), the cos/sin channels come section by section
    from the temporal, height and width positions. ``rotary_mode`` "half" (NeoX) or
    "interleave" (GPT-J) pairs the channels.
    """
    op = "npu_mrope"
    check(rotary_mode in MODES, op, f"rotary_mode must be one of {MODES}, got {rotary_mode!r}")
    if cache_mode != "default":
        raise NotImplementedError(f"{op}: cache_mode={cache_mode!r} is not supported on npusim")
    check(query.dim() == 2 and key.dim() == 2, op, "query and key must be 2-d (tokens, heads * "
          "head_size)")
    cs = cos_sin_cache[positions.long()]
    cos, sin = cs.chunk(2, dim=-1)
    if positions.dim() == 2:
        sections = list(mrope_section or [])
        check(len(sections) == 3 and sum(sections) == cos.size(-1), op, f"mrope_section must be "
              f"3 sizes summing to rotary_dim/2={cos.size(-1)}, got {mrope_section}")
        cos = torch.cat([c[i] for i, c in enumerate(cos.split(sections, dim=-1))], dim=-1)
        sin = torch.cat([s[i] for i, s in enumerate(sin.split(sections, dim=-1))], dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)           # (tokens, 1, rotary_dim / 2)
    rd = 2 * cos.size(-1)

    def rotate(x):
        t = x.size(0)
        x = x.reshape(t, -1, head_size)
        rot, rest = x[..., :rd], x[..., rd:]
        if rotary_mode == "half":
            x1, x2 = rot.chunk(2, dim=-1)
            rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((rot, rest), dim=-1).reshape(t, -1)
    return rotate(query), rotate(key)
