"""torch's hooks and device guard for the npu device (what a C++ backend registers).

torch 2.13's Python device guard (torch/csrc/acc/Module.cpp) only asks Python for ``type_``: its
device count is fixed at 1 and its current device at 0, so torch's autograd engine sizes its
per-device queues for one device and a backward on ``npu:N``, N > 0, fails inside torch
(docs/torch.md, limits). npusim's own device switching is in device.py.
"""
from __future__ import annotations

import itertools

import torch


class Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class DeviceGuard(torch._C._acc.DeviceGuard):
    """torch asks ``type_`` from C++ a few times per operator that autograd records and per
    backward node (its stream and device guards: ~900 times in a tiny GPT-2 Trainer step, ~1000
    in a tiny Llama step), each a pybind call into Python (~0.55 us). The answer never changes,
    so ``type_`` is a C callable that returns the constant, not a Python function: no frame, no
    bound method, 0.13 us less per call (pybind takes any Python callable that is not one of its
    own C++ functions as the override)."""

    type_ = staticmethod(itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__)
