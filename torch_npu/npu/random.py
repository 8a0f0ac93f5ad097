"""torch.npu.random (torch_npu.npu.random): the seeds and states of the npu generators.

One generator per simulated NPU (runtime/torch/random.py): a CPU ``torch.Generator`` that the
random operators on that NPU's tensors draw from, since they run torch's CPU kernels. States are
CPU ``uint8`` tensors as torch_npu's are, so a state saved here loads into torch's or another
rank's generator. ``torch.npu.default_generators`` is the tuple of those generators, as
MindSpeed's and DeepSpeed's activation checkpointing read it.
"""
from __future__ import annotations

import torch

import runtime
from runtime.torch import device as _device
from runtime.torch import random as _random

__all__ = ["get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
           "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]


def _index(device) -> int:
    """torch_npu's default ``device='npu'`` is the current NPU; an int or 'npu:N' is literal."""
    if isinstance(device, str) and device == "npu":
        return _device.current()
    return _device.check_index(device)


def get_rng_state(device="npu") -> torch.Tensor:
    """The generator state of NPU ``device`` (the current one by default), a CPU uint8 tensor."""
    return _random.generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device="npu") -> None:
    """Set the generator state of NPU ``device`` from ``get_rng_state``'s tensor."""
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(f"set_rng_state: new_state must be a torch.Tensor (a state from "
                        f"get_rng_state), got {type(new_state).__name__}")
    _random.generator(_index(device)).set_state(new_state.detach().to("cpu", torch.uint8))


def get_rng_state_all() -> list:
    """The states of every NPU's generator, NPU 0 first (accelerate's save_state)."""
    return [get_rng_state(i) for i in range(runtime.device_count())]


def set_rng_state_all(new_states) -> None:
    """Set NPU i's generator from ``new_states[i]`` (``get_rng_state_all``'s list)."""
    new_states = list(new_states)
    if len(new_states) > runtime.device_count():
        raise ValueError(f"set_rng_state_all: new_states has {len(new_states)} states but there "
                         f"are {runtime.device_count()} npu devices")
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed) -> None:
    """Seed the current NPU's generator."""
    _random.manual_seed(int(seed), _device.current())


def manual_seed_all(seed) -> None:
    """Seed every NPU's generator (``torch.manual_seed`` calls this)."""
    _random.manual_seed_all(int(seed), runtime.device_count())


def seed() -> None:
    """Seed the current NPU's generator with a non-deterministic number."""
    _random.generator(_device.current()).seed()


def seed_all() -> None:
    """Seed every NPU's generator with one non-deterministic number, as torch_npu does."""
    s = _random.generator(_device.current()).seed()
    for i in range(runtime.device_count()):
        _random.generator(i).manual_seed(s)


def initial_seed() -> int:
    """The current NPU's generator's initial seed."""
    return _random.generator(_device.current()).initial_seed()
