"""The reference run's shim: a CUDA (or torch.accelerator) script runs on CPU tensors with gloo.

Loaded by client_runner.py for ``--mode ref`` only, never for the npu run. It is the CPU
counterpart of ``torch_npu.contrib.transfer_to_npu``, so that the same unchanged script gives
the numbers npusim's run is compared with:

- ``torch.cuda.set_device`` does nothing (there is one CPU);
- ``torch.accelerator`` reports an accelerator that is the CPU, with LOCAL_WORLD_SIZE devices
  (pytorch/examples' ddp example asks for >= 2 before it starts), and ignores set_device_index;
  ``dist.get_default_backend_for_device("cpu")`` is then torch's own "gloo";
- backend ``"nccl"`` / ``"hccl"`` becomes ``"gloo"``;
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


def install() -> None:
    nlocal = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.cuda.set_device = lambda device: None
    acc = torch.accelerator
    acc.is_available = lambda: True
    acc.device_count = lambda: nlocal
    acc.current_accelerator = lambda check_available=False: torch.device("cpu")
    acc.set_device_index = lambda device: None
    acc.set_device_idx = lambda device: None

    init = dist.init_process_group

    @functools.wraps(init)
    def init_process_group(backend=None, *args, **kwargs):
        if kwargs.get("backend") in ("nccl", "hccl"):
            kwargs["backend"] = "gloo"
        if backend in ("nccl", "hccl"):
            backend = "gloo"
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
