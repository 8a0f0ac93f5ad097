"""Helpers shared by the fused operators: argument checks, the device generator, stubs."""
from __future__ import annotations

import torch


def check(cond: bool, op: str, msg: str) -> None:
    """Raise ValueError ``"<op>: <msg>"`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{op}: {msg}")


def generator_of(t: torch.Tensor) -> torch.Generator:
    """The generator a random draw on ``t``'s device uses: the npu device's own (what
    ``torch.npu.manual_seed`` seeds) for npu tensors, torch's default one for CPU tensors."""
    if t.device.type == "npu":
        from runtime.torch import random as _random
        return _random.generator(t.device.index or 0)
    return torch.default_generator


def draw_seed(t: torch.Tensor) -> int:
    """A 62-bit seed drawn from ``t``'s device generator (advances it, as a kernel's Philox
    offset would)."""
    return int(torch.randint(0, 2 ** 62, (1,), generator=generator_of(t)).item())


def uniform(seed: int, shape, device) -> torch.Tensor:
    """``torch.rand(shape)`` from a CPU generator seeded with ``seed``, placed on ``device``: the
    same numbers for the same seed on every device, so a backward can redraw a forward's mask."""
    g = torch.Generator()
    g.manual_seed(int(seed))
    return torch.rand(tuple(shape), generator=g).to(device)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of Ascend's fused kernels: float32 for half types."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class NoKernel(NotImplementedError):
    """A fused operator that needs a compiled CANN kernel (quantized, communication-fused...)."""


def unsupported(name: str, why: str):
    """A stand-in for ``torch_npu.<name>`` that raises NoKernel saying why."""
    def op(*args, **kwargs):
        raise NoKernel(f"torch_npu.{name} is not supported on npusim: {why}. npusim has no "
                       "compiled CANN kernel for it and computes fused operators with plain "
                       "torch operators (docs/torch.md, \"Fused operators\").")
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Not supported on npusim: {why}."
    return op
