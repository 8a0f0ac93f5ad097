"""The reference run's shim: a CUDA (or torch.accelerator) script runs on CPU tensors with gloo.

Loaded by client_runner.py for ``--mode ref`` (and ``ref-hccl``) only, never for the npu run.
It is the CPU counterpart of ``torch_npu.contrib.transfer_to_npu``, so that the same unchanged
script gives the numbers npusim's run is compared with:

- ``torch.cuda.set_device`` does nothing (there is one CPU); ``torch.cuda.is_available()`` is
  True and ``torch.cuda.device_count()`` is LOCAL_WORLD_SIZE, as under transfer_to_npu with one
  simulated NPU per local rank (a script that asks takes its accelerator path, DDP included);
- ``import torch_npu`` gives a stand-in, not npusim's package: ``torch_npu.contrib.transfer_to_npu``
  is this shim (already installed), ``torch_npu.npu.set_compile_mode`` / ``set_option`` and
  ``torch.npu.config.allow_internal_format = ...`` record nothing (CANN options, no effect on
  numbers on an NPU either), and every other name is missing: ``import torch_npu.utils...``
  raises ImportError, as a script's ``try: ... except ImportError`` expects;
- ``torch.accelerator`` reports an accelerator that is the CPU, with LOCAL_WORLD_SIZE devices
  (pytorch/examples' ddp example asks for >= 2 before it starts), and ignores set_device_index;
  ``dist.get_default_backend_for_device("cpu")`` is then torch's own "gloo";
- backend ``"nccl"`` / ``"hccl"`` becomes ``"gloo"`` (``install(backend="hccl")``: npusim's
  "hccl" on the CPU tensors, for a reference that adds ranks' values in hccl's order);
- a device that is an int, ``"cuda..."`` / ``"npu..."`` or such a ``torch.device`` becomes
  ``"cpu"`` where the script passes it: ``Tensor.to`` / ``Module.to``, ``.cuda()``,
  ``torch.load(map_location=...)``;
- DDP gets ``device_ids=None`` / ``output_device=None`` (what DDP requires of a CPU module);
- ``DataLoader(pin_memory=True)`` pins nothing, as on a CPU-only torch (which warns and skips
  it): with the accelerator above being the CPU, torch would try to pin for it and fail.

It patches this process's torch and nothing else; it is test code, not part of npusim.
"""
from __future__ import annotations

import functools
import os
import sys
import types

import torch
import torch.distributed as dist


def _cpu(d):
    if isinstance(d, int) and not isinstance(d, bool):
        return "cpu"
    if isinstance(d, str) and d.split(":")[0] in ("cuda", "npu"):
        return "cpu"
    if isinstance(d, torch.device) and d.type in ("cuda", "npu"):
        return "cpu"
    return d


def _to(fn):
    @functools.wraps(fn)
    def w(self, *args, **kwargs):
        if args:
            args = (_cpu(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return fn(self, *args, **kwargs)
    return w


class _Config:
    """``torch.npu.config`` of the stand-in: takes ``allow_internal_format`` and nothing else."""

    def __setattr__(self, name, value):
        if name != "allow_internal_format":
            raise AttributeError(f"torch.npu.config has no option '{name}'")


def _torch_npu_stand_in() -> None:
    """``sys.modules["torch_npu"]`` and friends: the names a script calls that are CANN options."""
    pkg = types.ModuleType("torch_npu")
    pkg.__path__ = []           # a package with no submodules: ``torch_npu.utils`` is ImportError
    npu = types.ModuleType("torch_npu.npu")
    npu.set_compile_mode = lambda jit_compile=False: None
    npu.set_option = lambda option: None
    npu.config = _Config()
    contrib = types.ModuleType("torch_npu.contrib")
    contrib.__path__ = []
    contrib.transfer_to_npu = types.ModuleType("torch_npu.contrib.transfer_to_npu")
    pkg.npu, pkg.contrib = npu, contrib
    sys.modules.update({"torch_npu": pkg, "torch_npu.npu": npu, "torch_npu.contrib": contrib,
                        "torch_npu.contrib.transfer_to_npu": contrib.transfer_to_npu})
    torch.npu = npu


def install(backend: str = "gloo") -> None:
    if backend == "hccl":
        import hccl.torch_backend  # noqa: F401 - registers "hccl" (CPU tensors)
    nlocal = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    _torch_npu_stand_in()
    torch.cuda.set_device = lambda device: None
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: nlocal
    acc = torch.accelerator
    acc.is_available = lambda: True
    acc.device_count = lambda: nlocal
    acc.current_accelerator = lambda check_available=False: torch.device("cpu")
    acc.set_device_index = lambda device: None
    acc.set_device_idx = lambda device: None

    init = dist.init_process_group
    ref_backend = backend

    @functools.wraps(init)
    def init_process_group(backend=None, *args, **kwargs):
        if kwargs.get("backend") in ("nccl", "hccl"):
            kwargs["backend"] = ref_backend
        if backend in ("nccl", "hccl"):
            backend = ref_backend
        return init(backend, *args, **kwargs)
    dist.init_process_group = init_process_group

    torch.Tensor.to = _to(torch.Tensor.to)
    torch.nn.Module.to = _to(torch.nn.Module.to)
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **kw: self
    torch.nn.Module.cuda = lambda self, device=None: self

    load = torch.load

    @functools.wraps(load)
    def cpu_load(*args, **kwargs):
        if "map_location" in kwargs:
            kwargs["map_location"] = _cpu(kwargs["map_location"])
        return load(*args, **kwargs)
    torch.load = cpu_load

    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp_init = DDP.__init__

    @functools.wraps(ddp_init)
    def cpu_ddp_init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        return ddp_init(self, module, None, None, *args, **kwargs)
    DDP.__init__ = cpu_ddp_init

    from torch.utils.data import DataLoader
    dl_init = DataLoader.__init__

    @functools.wraps(dl_init)
    def unpinned_init(self, *args, **kwargs):
        kwargs["pin_memory"] = False
        return dl_init(self, *args, **kwargs)
    DataLoader.__init__ = unpinned_init
