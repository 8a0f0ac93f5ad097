"""``from torch_npu.contrib import transfer_to_npu``: a CUDA script runs on npusim's npu device.

As torch_npu's module of that name: ``torch.cuda.*`` become ``torch.npu.*``; ``.cuda()``
becomes ``.npu()``; a ``"cuda"`` device (string or torch.device) given to the tensor factories,
``Tensor.to`` / ``Module.to``, DDP's ``device_ids`` and ``torch.load``'s ``map_location``
becomes ``"npu"``; backend ``"nccl"`` becomes ``"hccl"`` (npusim's backend, imported here).
Limits: ``torch.device("cuda")`` itself still names CUDA; it is translated where it is passed
to the functions above.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

import hccl.torch.backend  # noqa: F401 - registers "hccl", also as torch's default for npu
import torch_npu  # noqa: F401 - registers the device

_CUDA_NAMES = ("is_available", "device_count", "set_device", "current_device", "get_device_name",
               "synchronize", "Stream", "Event", "current_stream", "default_stream", "stream",
               "memory_allocated", "memory_reserved", "max_memory_allocated",
               "max_memory_reserved", "reset_peak_memory_stats", "memory_stats",
               "memory_summary", "empty_cache", "mem_get_info", "manual_seed", "manual_seed_all",
               "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "device",
               "get_device_properties", "is_bf16_supported")
# torch.cuda.amp stays torch's module (torch._dynamo, which optimizers import, reads
# torch.cuda.amp.autocast_mode); the names scripts use from it become torch.npu.amp's
_AMP_NAMES = ("autocast", "GradScaler", "custom_fwd", "custom_bwd")


def _dev(d):
    if isinstance(d, str) and d.startswith("cuda"):
        return "npu" + d[4:]
    if isinstance(d, torch.device) and d.type == "cuda":
        return torch.device("npu", d.index) if d.index is not None else torch.device("npu")
    return d


def _wrap(fn):
    @functools.wraps(fn)
    def w(*args, **kwargs):
        args = tuple(_dev(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _dev(kwargs["device"])
        return fn(*args, **kwargs)
    return w


_FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
              "randperm", "arange", "linspace", "eye", "zeros_like", "ones_like", "empty_like",
              "full_like", "rand_like", "randn_like", "empty_strided", "normal")


def _load(fn):
    """torch.load with a "cuda" map_location (a device, or a dict of them) mapped to "npu"."""
    @functools.wraps(fn)
    def w(f, map_location=None, *args, **kwargs):
        if isinstance(map_location, dict):
            map_location = {_dev(k): _dev(v) for k, v in map_location.items()}
        return fn(f, _dev(map_location), *args, **kwargs)
    return w


def _cuda(self, device=None, non_blocking=False, **kwargs):
    return self.npu(device, non_blocking=non_blocking) if isinstance(self, torch.Tensor) \
        else self.npu(device)


def _init_process_group(fn):
    @functools.wraps(fn)
    def w(backend=None, *args, **kwargs):
        if backend == "nccl" or (backend is None and kwargs.get("backend") == "nccl"):
            backend = "hccl"
            kwargs.pop("backend", None)
        return fn(backend, *args, **kwargs)
    return w


def _apply() -> None:
    for name in _CUDA_NAMES:
        if hasattr(torch.npu, name):
            setattr(torch.cuda, name, getattr(torch.npu, name))
    for name in _AMP_NAMES:
        setattr(torch.cuda.amp, name, getattr(torch.npu.amp, name))
    for name in _FACTORIES:
        setattr(torch, name, _wrap(getattr(torch, name)))
    torch.load = _load(torch.load)
    torch.Tensor.to = _wrap(torch.Tensor.to)
    torch.nn.Module.to = _wrap(torch.nn.Module.to)
    torch.Tensor.cuda = _cuda
    torch.nn.Module.cuda = _cuda
    dist.init_process_group = _init_process_group(dist.init_process_group)
    from torch.nn.parallel import DistributedDataParallel as DDP
    init = DDP.__init__

    @functools.wraps(init)
    def ddp_init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None:
            device_ids = [_dev(d) for d in device_ids]
        return init(self, module, device_ids, _dev(output_device), *args, **kwargs)
    DDP.__init__ = ddp_init


if not getattr(torch.cuda, "_npusim_transferred", False):
    _apply()
    torch.cuda._npusim_transferred = True
