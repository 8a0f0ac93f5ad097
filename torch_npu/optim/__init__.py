"""torch_npu.optim: the fused optimizers, with torch's math.

On Ascend ``NpuFused*`` optimizers flatten every parameter and gradient of a group into one
buffer and update it with a single kernel; on npusim they are torch's own optimizers running
their multi-tensor (``foreach``) path on the npu device, so one step gives exactly what
``torch.optim.AdamW(..., foreach=True)`` gives (transformers' ``optim="adamw_torch_npu_fused"``
builds ``NpuFusedAdamW``). Constructor arguments and defaults are torch_npu's (``NpuFusedSGD``
needs ``lr``; ``NpuFusedAdam`` has no weight decay by default, ``NpuFusedAdamW`` 1e-2), as are
``zero_grad(set_to_none=False)`` and ``clip_grad_norm_fused_``.

NpuFusedLamb, NpuFusedAdamP, NpuFusedBertAdam and NpuFusedRMSpropTF have no torch counterpart;
constructing one raises NotImplementedError.
"""
from __future__ import annotations

import torch
from torch.optim.optimizer import required

__all__ = ["NpuFusedOptimizerBase", "NpuFusedSGD", "NpuFusedAdadelta", "NpuFusedLamb",
           "NpuFusedAdam", "NpuFusedAdamW", "NpuFusedAdamP", "NpuFusedBertAdam",
           "NpuFusedRMSprop", "NpuFusedRMSpropTF"]


class NpuFusedOptimizerBase:
    """What every NpuFused optimizer adds to its torch optimizer."""

    def zero_grad(self, set_to_none: bool = False) -> None:
        super().zero_grad(set_to_none=set_to_none)

    def _params(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    def get_combined_params(self) -> list:
        """The parameters (torch_npu returns its flat buffers; npusim keeps them separate)."""
        return self._params()

    def get_combined_grads(self) -> list:
        return [p.grad for p in self._params() if p.grad is not None]

    def clip_grad_norm_fused_(self, max_norm, norm_type=2):
        """Clip the gradients of every parameter of this optimizer to ``max_norm``; returns the
        total norm (``torch.nn.utils.clip_grad_norm_``)."""
        return torch.nn.utils.clip_grad_norm_(self._params(), max_norm, norm_type=norm_type,
                                              foreach=True)


class NpuFusedSGD(NpuFusedOptimizerBase, torch.optim.SGD):
    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False):
        if lr is required:
            raise ValueError("NpuFusedSGD: lr is required")
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, foreach=True)


class NpuFusedAdam(NpuFusedOptimizerBase, torch.optim.Adam):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=True)


class NpuFusedAdamW(NpuFusedOptimizerBase, torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=True)


class NpuFusedAdadelta(NpuFusedOptimizerBase, torch.optim.Adadelta):
    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0):
        super().__init__(params, lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                         foreach=True)


class NpuFusedRMSprop(NpuFusedOptimizerBase, torch.optim.RMSprop):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                         momentum=momentum, centered=centered, foreach=True)


def _no_torch_counterpart(name: str):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"torch_npu.optim.{name} is not supported on npusim: torch has "
                                  "no optimizer with its math to run it with; use NpuFusedAdamW "
                                  "or a torch.optim optimizer")
    return type(name, (NpuFusedOptimizerBase, torch.optim.Optimizer), {"__init__": __init__})


NpuFusedLamb = _no_torch_counterpart("NpuFusedLamb")
NpuFusedAdamP = _no_torch_counterpart("NpuFusedAdamP")
NpuFusedBertAdam = _no_torch_counterpart("NpuFusedBertAdam")
NpuFusedRMSpropTF = _no_torch_counterpart("NpuFusedRMSpropTF")
