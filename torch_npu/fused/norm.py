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
