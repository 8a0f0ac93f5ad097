"""The npu random generators: one CPU ``torch.Generator`` per simulated NPU.

Random operators on npu tensors run torch's CPU kernels; one that is given no generator draws
from its device's generator here (what torch.npu.manual_seed seeds), not from the CPU's. Each
starts at torch's default seed, and ``torch.manual_seed`` seeds them too (torch calls
``torch.npu.manual_seed_all``), so a seeded script draws the same numbers on npu as on CPU.
"""
from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_gens: dict = {}
DEFAULT_SEED = torch.Generator().initial_seed()


def generator(index: int) -> torch.Generator:
    g = _gens.get(index)
    if g is None:
        with _lock:
            g = _gens.get(index)
            if g is None:
                g = _gens[index] = torch.Generator()
                g.manual_seed(DEFAULT_SEED)
    return g


def manual_seed(seed: int, index: int) -> None:
    generator(index).manual_seed(int(seed))


def manual_seed_all(seed: int, count: int) -> None:
    for i in range(count):
        generator(i).manual_seed(int(seed))
