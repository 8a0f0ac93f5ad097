"""Optimizer-step operators: ``npu_apply_adam_w`` and ``npu_apply_adam``.

Both update ``out=(var, m, v)`` in place and return it (DeepSpeed's FusedAdam on Ascend calls
them once per flat parameter buffer). ``npu_apply_adam_w`` follows its docstring's formula, with
``beta1_power`` / ``beta2_power`` = beta^(t-1) (the kernel multiplies in this step's beta):
``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g^2`` (amsgrad: ``v = max(max_grad_norm, v)``),
``var -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + lr * weight_decay * var``.
``npu_apply_adam`` is CANN's ApplyAdam (TensorFlow's): ``beta*_power`` = beta^t,
``lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)``, ``var -= lr_t * m / (sqrt(v) + eps)`` (nesterov:
``m`` replaced by ``b1*m + (1-b1)*g``).
"""
from __future__ import annotations

import math

import torch

from ._common import check


def _outs(out, op: str):
    check(out is not None and len(out) == 3, op, "out=(var, m, v) is required")
    return out


@torch.no_grad()
def npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                     max_grad_norm=None, amsgrad=False, maximize=False, *, out=None):
    """torch_npu.npu_apply_adam_w(..., out=(var, m, v)) -> (var, m, v), updated in place."""
    op = "npu_apply_adam_w"
    var, m, v = _outs(out, op)
    check(not amsgrad or max_grad_norm is not None, op, "amsgrad=True needs max_grad_norm")
    g = -grad if maximize else grad
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    if amsgrad:
        torch.maximum(v, max_grad_norm, out=v)
    c1 = 1 - float(beta1_power) * beta1
    c2 = 1 - float(beta2_power) * beta2
    denom = (v / c2).sqrt_().add_(epsilon)
    step = (m / c1).div_(denom).mul_(lr)
    var.sub_(var * (lr * weight_decay)).sub_(step)
    return var, m, v


@torch.no_grad()
def npu_apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking=False,
                   use_nesterov=False, *, out=None):
    """torch_npu.npu_apply_adam(..., out=(var, m, v)) -> (var, m, v), updated in place."""
    var, m, v = _outs(out, "npu_apply_adam")
    m.add_(grad - m, alpha=1 - beta1)
    v.add_(grad * grad - v, alpha=1 - beta2)
    lr_t = lr * math.sqrt(1 - float(beta2_power)) / (1 - float(beta1_power))
    num = m * beta1 + grad * (1 - beta1) if use_nesterov else m
    var.sub_(num / (v.sqrt() + epsilon) * lr_t)
    return var, m, v
