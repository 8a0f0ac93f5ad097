"""Normalization operators: ``npu_rms_norm``, ``npu_add_rms_norm``, ``npu_gemma_rms_norm``,
``npu_layer_norm_eval``.

RMSNorm normalizes over the trailing ``gamma.dim()`` axes of x: ``rstd = 1 / sqrt(mean(x^2) +
epsilon)``, ``y = x * rstd * gamma`` (Gemma: ``* (1 + gamma)``), computed in float32 for half
inputs as the kernels accumulate; y has x's dtype, rstd is float32 with x's leading axes and 1s
for the normalized ones (torch_npu's meta registration). Autograd comes from the composition.
"""
from __future__ import annotations

import torch

from ._common import check, compute_dtype


def _rstd(x, gamma, epsilon: float, op: str):
    check(gamma.dim() <= x.dim() and tuple(x.shape[x.dim() - gamma.dim():]) == tuple(gamma.shape),
          op, f"gamma of shape {tuple(gamma.shape)} must be the trailing axes of x "
          f"{tuple(x.shape)}")
    ct = compute_dtype(x.dtype)
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.to(ct)
    return xf, torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)


def npu_rms_norm(self, gamma, epsilon=1e-06):
    """torch_npu.npu_rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd)."""
    xf, rstd = _rstd(self, gamma, epsilon, "npu_rms_norm")
    y = (xf * rstd * gamma.to(xf.dtype)).to(self.dtype)
    return y, rstd.float()


def npu_gemma_rms_norm(self, gamma, epsilon=1e-06):
    """torch_npu.npu_gemma_rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd), y = x*rstd*(1+gamma)."""
    xf, rstd = _rstd(self, gamma, epsilon, "npu_gemma_rms_norm")
    y = (xf * rstd * (1 + gamma.to(xf.dtype))).to(self.dtype)
    return y, rstd.float()


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
    """torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6) -> (y, rstd, x) with x = x1 + x2
    (the residual sum the next layer adds to) and (y, rstd) = npu_rms_norm(x, gamma)."""
    check(x1.shape == x2.shape, "npu_add_rms_norm", f"x1 {tuple(x1.shape)} and x2 "
          f"{tuple(x2.shape)} must have one shape")
    x = x1 + x2
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y, rstd, x


def npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    """torch_npu.npu_layer_norm_eval: ``torch.nn.functional.layer_norm``."""
    return torch.nn.functional.layer_norm(input, list(normalized_shape), weight, bias, eps)


def _group_norm_stats(input, groups: int, eps: float, op: str):
    check(input.dim() >= 2 and input.size(1) % groups == 0, op, f"input's axis 1 "
          f"({input.size(1) if input.dim() > 1 else None}) must split into {groups} groups")
    ct = compute_dtype(input.dtype)
    g = input.to(ct).reshape(input.size(0), groups, -1)
    mean = g.mean(dim=-1)
    rstd = torch.rsqrt(g.var(dim=-1, unbiased=False) + eps)
    return mean, rstd, ct


def _group_normed(input, weight, bias, groups, eps, op):
    mean, rstd, ct = _group_norm_stats(input, groups, eps, op)
    y = torch.nn.functional.group_norm(input.to(ct), groups,
                                       None if weight is None else weight.to(ct),
                                       None if bias is None else bias.to(ct), eps)
    return y, mean, rstd


def npu_group_norm_silu(input, weight, bias, group, eps=1e-05):
    """torch_npu.npu_group_norm_silu(x, weight, bias, group, eps) -> (silu(group_norm(x)), mean,
    rstd), mean / rstd of shape (N, group) in x's dtype."""
    y, mean, rstd = _group_normed(input, weight, bias, group, eps, "npu_group_norm_silu")
    dt = input.dtype
    return torch.nn.functional.silu(y).to(dt), mean.to(dt), rstd.to(dt)


def npu_group_norm_swish(input, num_groups, weight, bias, eps=1e-05, swish_scale=1.0):
    """torch_npu.npu_group_norm_swish(x, num_groups, weight, bias, eps=1e-5, swish_scale=1.0)
    -> (y * sigmoid(swish_scale * y) with y = group_norm(x), mean, rstd)."""
    y, mean, rstd = _group_normed(input, weight, bias, num_groups, eps, "npu_group_norm_swish")
    dt = input.dtype
    return (y * torch.sigmoid(swish_scale * y)).to(dt), mean.to(dt), rstd.to(dt)


def npu_rms_norm_backward(dy, self, gamma, rstd):
    """torch_npu.npu_rms_norm_backward(dy, x, gamma, rstd) -> (dx, dgamma float32): the gradients
    of npu_rms_norm's y (rstd is recomputed from x)."""
    with torch.enable_grad():
        x = self.detach().requires_grad_()
        g = gamma.detach().requires_grad_()
        y = npu_rms_norm(x, g)[0]
        dx, dg = torch.autograd.grad(y, (x, g), dy)
    return dx, dg.float()
