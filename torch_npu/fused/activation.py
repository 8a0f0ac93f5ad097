"""Activations: ``npu_swiglu``, ``npu_geglu``, ``npu_gelu_mul``, ``npu_clipped_swiglu``,
``npu_fast_gelu`` / ``fast_gelu``, ``npu_silu``, ``npu_mish``.

Gated units split x in two halves along ``dim`` (A first, B second) and multiply:
``swiglu = silu(A) * B``; ``geglu`` activates B unless ``activate_left`` (the real default);
``gelu_mul = gelu(A) * B`` over the last axis. Half inputs are computed in float32 and the result
cast back, as the kernels do. Autograd comes from the composition.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import check, compute_dtype


def _halves(x, dim: int, op: str):
    check(x.dim() > 0 and -x.dim() <= dim < x.dim(), op, f"dim={dim} is out of range for a "
          f"{x.dim()}-d input")
    check(x.size(dim) % 2 == 0, op, f"x's size {x.size(dim)} along dim={dim} must be even")
    a, b = x.to(compute_dtype(x.dtype)).chunk(2, dim=dim)
    return a, b


def npu_swiglu(self, dim=-1):
    """torch_npu.npu_swiglu(x, dim=-1) -> ``silu(A) * B`` with A, B = x.chunk(2, dim)."""
    a, b = _halves(self, dim, "npu_swiglu")
    return (F.silu(a) * b).to(self.dtype)


def npu_geglu(self, dim=-1, approximate=1, activate_left=False):
    """torch_npu.npu_geglu(x, dim=-1, approximate=1, activate_left=False) -> (y, gelu): the
    activated half goes through gelu (approximate 0: erf, 1: tanh) and multiplies the other."""
    check(approximate in (0, 1), "npu_geglu", f"approximate must be 0 (none) or 1 (tanh), got "
          f"{approximate!r}")
    a, b = _halves(self, dim, "npu_geglu")
    act, gate = (a, b) if activate_left else (b, a)
    g = F.gelu(act, approximate="tanh" if approximate == 1 else "none")
    return (g * gate).to(self.dtype), g.to(self.dtype)


def npu_gelu_mul(input, *, approximate="none"):
    """torch_npu.npu_gelu_mul(x, approximate='none') -> ``gelu(A) * B`` over the last axis."""
    check(approximate in ("none", "tanh"), "npu_gelu_mul", f"approximate must be 'none' or "
          f"'tanh', got {approximate!r}")
    a, b = _halves(input, -1, "npu_gelu_mul")
    return (F.gelu(a, approximate=approximate) * b).to(input.dtype)


def npu_clipped_swiglu(x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0,
                       interleaved=True):
    """torch_npu.npu_clipped_swiglu: ``A * sigmoid(alpha * A) * (B + bias)`` with A clamped
    above at ``limit`` and B into [-limit, limit]; x is merged to [pre, dim * after] and A/B are
    its even/odd elements (``interleaved``) or first/second halves; with ``group_index`` only
    the first sum(group_index) rows of the axes before
    ``dim`` are computed (the rest of y is 0)."""
    op = "npu_clipped_swiglu"
    check(x.dim() > 1, op, f"x must have more than 1 axis, got {x.dim()}")
    d = dim % x.dim()
    check(x.size(d) % 2 == 0, op, f"x's size {x.size(d)} along dim={dim} must be even")
    shape = x.shape
    pre = 1
    for s in shape[:d]:
        pre *= s
    flat = x.reshape(pre, -1).to(compute_dtype(x.dtype))
    rows = pre if group_index is None else int(group_index.sum())
    work = flat[:rows]
    if interleaved:     # even / odd elements of the merged (cut * after) axis, as documented
        a, b = work[:, 0::2], work[:, 1::2]
    else:
        a, b = work.chunk(2, dim=1)
    a = a.clamp(max=limit)
    b = b.clamp(min=-limit, max=limit)
    y = (a * torch.sigmoid(alpha * a) * (b + bias)).reshape(rows, -1)
    if rows < pre:
        y = torch.cat((y, y.new_zeros(pre - rows, y.size(1))), dim=0)
    out_shape = list(shape)
    out_shape[d] //= 2
    return y.reshape(out_shape).to(x.dtype)


def npu_fast_gelu(input):
    """torch_npu.npu_fast_gelu(x) -> ``x * sigmoid(1.702 * x)`` (Atlas A2's formula)."""
    xf = input.to(compute_dtype(input.dtype))
    return (xf * torch.sigmoid(1.702 * xf)).to(input.dtype)


fast_gelu = npu_fast_gelu


def npu_silu(self):
    """torch_npu.npu_silu(x) -> ``x * sigmoid(x)``."""
    return F.silu(self)


def npu_mish(self):
    """torch_npu.npu_mish(x) -> ``x * tanh(softplus(x))``."""
    return F.mish(self)


def npu_swiglu_backward(grad_output, x, dim=-1):
    """torch_npu.npu_swiglu_backward(dy, x, dim=-1) -> dx, the gradient of npu_swiglu."""
    with torch.enable_grad():
        xx = x.detach().requires_grad_()
        (dx,) = torch.autograd.grad(npu_swiglu(xx, dim), (xx,), grad_output)
    return dx
