"""``from torch_npu.contrib import transfer_to_npu``: a CUDA script runs on npusim's npu device.

What torch_npu 2.14.0's module of that name patches, read from its source (its lists are
mirrored below under the same names), and done here the same way:

- **torch.cuda is torch.npu**: every name of ``torch.npu.__all__`` is set on ``torch.cuda``
  (``torch.cuda.is_available()`` is True, ``torch.cuda.Stream`` is torch.npu's ...), as are
  the names of torch.npu.random on ``torch.cuda.random`` and of torch.npu.amp (and its
  autocast_mode, grad_scaler, common modules) on ``torch.cuda.amp``'s; ``default_generators``
  too; ``torch.cuda.DoubleTensor`` is ``torch.npu.FloatTensor`` and ``torch.cuda.CUDAGraph``
  ``torch.npu.NPUGraph``, as torch_npu sets them.
- **"cuda" device arguments become "npu"** in the functions of TORCH_FN_WHITE_LIST (factories,
  ``torch.load``'s ``map_location``, ``set_default_device`` ...), TORCH_TENSOR_FN_WHITE_LIST
  (``Tensor.to`` and ``new_*``; an int given to ``to`` is ``npu:N``), TORCH_MODULE_FN_WHITE_LIST,
  TORCH_CUDA_FN_WHITE_LIST (``torch.cuda.set_device("cuda:0")``, ``get_device_capability``...),
  torch.cuda.random's state functions, ``torch.cuda.device``, ``torch.UntypedStorage``,
  ``torch.autocast("cuda")`` (npu autocast), the autocast getters and setters,
  ``torch.amp.custom_fwd / custom_bwd``, ``torch.fft.fftfreq / rfftfreq``, DDP, FSDP,
  DeviceMesh / ``init_device_mesh``, pipelining's ``PipelineStage`` / ``build_stage``,
  ``torch.device(...)`` as a context (DeviceContext) and ``ProcessGroup._get_backend``. A string
  has every "cuda" replaced by "npu"; a ``torch.device("cuda", i)`` becomes ``npu:i``; a dict
  (``map_location``) has its keys and values rewritten.
- ``torch.Event(device="cuda")`` is an npu ``torch.Event``;
  ``torch.Generator(device="cuda")``: a generator for npu tensors. npusim's npu operators run
  torch's CPU kernels, so this is a CPU ``torch.Generator``, which they accept.
- ``Tensor.is_cuda`` is ``Tensor.is_npu`` (True on npu tensors), ``.cuda()`` is ``.npu()``.
- torch.distributed: backend "nccl" (also inside "cpu:gloo,cuda:nccl") becomes "hccl",
  ``is_nccl_available`` is ``is_hccl_available``, ``ProcessGroupNCCL`` is ProcessGroupHCCL,
  and init_device_mesh no longer maps "cuda" to nccl.
- torch.profiler: ``profile``, ``schedule``, ``tensorboard_trace_handler``, ``ProfilerAction``
  and ``ProfilerActivity.CUDA / CPU`` are torch_npu.profiler's (npusim's trace and summary).

``torch.cuda.memory._snapshot`` / ``_dump_snapshot`` are npusim's pool's (segments, no
allocation history: ``_record_memory_history`` raises saying so).

Not done here, though torch_npu does them: disabling ``torch.jit.script``, answering "no
triton" and "npu" to inductor's GPU-type queries, replacing torch.cuda.amp's modules (their
names are set instead: torch._dynamo reads those modules), torch_npu's cpp_extension, and the
per-library wrappers of torch_npu's apis_config.json (none ship in the wheel). ``torch.device("cuda")`` itself still
names CUDA: it is translated where passed to the functions above.
"""
from __future__ import annotations

import functools
import importlib

import torch
import torch.distributed as dist

import hccl.torch.backend  # noqa: F401 - registers "hccl", also as torch's default for npu
import torch_npu

# torch_npu 2.14.0's lists, as its transfer_to_npu names them
TORCH_FN_WHITE_LIST = (
    "logspace", "randint", "hann_window", "rand", "full_like", "ones_like", "rand_like",
    "randperm", "arange", "frombuffer", "normal", "_empty_per_channel_affine_quantized",
    "empty_strided", "empty_like", "scalar_tensor", "tril_indices", "bartlett_window", "ones",
    "sparse_coo_tensor", "randn", "kaiser_window", "tensor", "triu_indices", "as_tensor",
    "zeros", "randint_like", "full", "eye", "_sparse_csr_tensor_unsafe", "empty",
    "_sparse_coo_tensor_unsafe", "blackman_window", "zeros_like", "range", "sparse_csr_tensor",
    "randn_like", "from_file", "_cudnn_init_dropout_state", "_empty_affine_quantized",
    "linspace", "hamming_window", "empty_quantized", "_pin_memory", "load",
    "set_default_device", "get_device_module", "sparse_compressed_tensor")
TORCH_TENSOR_FN_WHITE_LIST = ("new_empty", "new_empty_strided", "new_full", "new_ones",
                              "new_tensor", "new_zeros", "to", "pin_memory")
TORCH_MODULE_FN_WHITE_LIST = ("to", "to_empty")
TORCH_CUDA_FN_WHITE_LIST = (
    "get_device_properties", "get_device_name", "get_device_capability", "list_gpu_processes",
    "set_device", "synchronize", "mem_get_info", "memory_stats", "memory_summary",
    "memory_allocated", "max_memory_allocated", "reset_max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "reset_max_memory_cached", "reset_peak_memory_stats",
    "default_stream", "can_device_access_peer", "current_stream", "utilization",
    "set_per_process_memory_fraction", "caching_allocator_alloc", "get_rng_state",
    "set_rng_state")
DEVICE_KWARGS = ("device", "device_type", "map_location", "device_id")

_patched: list = []          # (owner, name) of every attribute set, for the record


def _set(owner, name: str, value) -> None:
    setattr(owner, name, value)
    _patched.append((owner, name))


# ---- rewriting "cuda" to "npu" --------------------------------------------------------------

def _npu_device(d: torch.device) -> torch.device:
    return torch.device("npu", d.index) if d.index is not None else torch.device("npu")


def _rewrite(arg, replace_int: bool = False):
    if isinstance(arg, str) and "cuda" in arg:
        return arg.replace("cuda", "npu")
    if isinstance(arg, torch.device) and arg.type == "cuda":
        return _npu_device(arg)
    if replace_int and isinstance(arg, int) and not isinstance(arg, bool):
        return f"npu:{arg}"
    if isinstance(arg, dict):
        return {(k.replace("cuda", "npu") if isinstance(k, str) else k):
                (v.replace("cuda", "npu") if isinstance(v, str) else _rewrite(v))
                for k, v in arg.items()}
    return arg


def _rewrite_call(args, kwargs, replace_int: bool):
    args = tuple(_rewrite(a, replace_int) for a in args)
    for k in DEVICE_KWARGS:
        v = kwargs.get(k)
        if v is not None:
            kwargs[k] = f"npu:{v}" if isinstance(v, int) and not isinstance(v, bool) \
                else _rewrite(v)
    ids = kwargs.get("device_ids")
    if isinstance(ids, (list, tuple)):
        kwargs["device_ids"] = type(ids)(_rewrite(i, replace_int) for i in ids)
    return args, kwargs


def _wrap_cuda(fn):
    """``fn`` with its "cuda" device arguments made "npu" (torch_npu's ``_wrapper_cuda``)."""
    if getattr(fn, "_npusim_cuda_wrapped", False):
        return fn
    replace_int = getattr(fn, "__name__", "") in ("to", "to_empty")

    @functools.wraps(fn)
    def w(*args, **kwargs):
        args, kwargs = _rewrite_call(args, kwargs, replace_int)
        return fn(*args, **kwargs)
    w._npusim_cuda_wrapped = True
    return w


def _wrap_all(owner, names) -> None:
    for name in names:
        fn = getattr(owner, name, None)
        if fn is not None:
            _set(owner, name, _wrap_cuda(fn))


def _nccl_to_hccl(s):
    return s.replace("nccl", "hccl").replace("cuda", "npu") if isinstance(s, str) else s


def _wrap_hccl(fn):
    @functools.wraps(fn)
    def w(*args, **kwargs):
        args = tuple(_nccl_to_hccl(a) for a in args)
        if isinstance(kwargs.get("backend"), str):
            kwargs["backend"] = _nccl_to_hccl(kwargs["backend"])
        return fn(*args, **kwargs)
    return w


# ---- the patches ----------------------------------------------------------------------------

class _TypeProxyMeta(type(torch.Generator)):
    """Keeps ``isinstance(g, torch.Generator)`` True for generators made before the patch."""

    def __instancecheck__(cls, obj):
        return super().__instancecheck__(obj) or isinstance(obj, cls.__mro__[1])


class _GeneratorProxy(torch.Generator, metaclass=_TypeProxyMeta):
    """``torch.Generator(device="cuda" / "npu")``: a CPU generator, which npusim's npu random
    operators draw from (they run torch's CPU kernels); other devices as torch's."""

    def __new__(cls, device="cpu"):
        d = _rewrite(device)
        if torch.device(d).type == "npu":
            d = "cpu"
        return _TORCH_GENERATOR(d)


_TORCH_GENERATOR = torch.Generator
_TORCH_EVENT = torch.Event


class _EventProxy(torch.Event, metaclass=_TypeProxyMeta):
    """``torch.Event(device="cuda")``: an npu event (a plain ``torch.Event``, as torch_npu
    returns one: torch 2.13's ``Stream.record_event`` refuses subclasses)."""

    def __new__(cls, *args, **kwargs):
        args, kwargs = _rewrite_call(args, kwargs, False)
        return _TORCH_EVENT(*args, **kwargs)


def _copy_all(src, dst) -> None:
    for name in src.__all__:
        _set(dst, name, getattr(src, name))


def _patch_cuda() -> None:
    npu = torch_npu.npu
    _copy_all(npu, torch.cuda)
    _copy_all(npu.random, torch.cuda.random)
    _copy_all(npu.amp, torch.cuda.amp)
    for mod in ("autocast_mode", "grad_scaler", "common"):
        dst = importlib.import_module(f"torch.cuda.amp.{mod}")
        _copy_all(getattr(npu.amp, mod), dst)
    _wrap_all(torch.cuda, TORCH_CUDA_FN_WHITE_LIST)
    _wrap_all(torch.cuda.random, ("get_rng_state", "set_rng_state"))
    npu.device.__init__ = _wrap_cuda(npu.device.__init__)
    _set(torch.cuda, "default_generators", npu.default_generators)
    _wrap_all(npu.memory, ("_record_memory_history", "_snapshot"))
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot"):
        _set(torch.cuda.memory, name, getattr(npu.memory, name))
    _set(torch.cuda, "DoubleTensor", npu.FloatTensor)
    _set(torch.cuda, "CUDAGraph", npu.NPUGraph)


def _patch_torch() -> None:
    import torch.utils._device as _udev
    # the set of factories `with torch.device(...)` applies to is cached on first use: fill it
    # with torch's own functions before they are wrapped (torch_npu does the same)
    _udev._device_constructors()
    _wrap_all(torch, TORCH_FN_WHITE_LIST)
    torch.UntypedStorage.__new__ = _wrap_cuda(torch.UntypedStorage.__new__)
    _set(torch, "Generator", _GeneratorProxy)
    _set(torch, "Event", _EventProxy)
    ac = torch.amp.autocast_mode.autocast
    ac.__init__ = _wrap_cuda(ac.__init__)

    def _autocast_device(device_type=None):
        return "npu" if device_type is None else _rewrite(device_type)

    is_enabled, set_enabled = torch.is_autocast_enabled, torch.set_autocast_enabled

    @functools.wraps(is_enabled)
    def is_autocast_enabled(device_type=None):
        return is_enabled(_autocast_device(device_type))

    @functools.wraps(set_enabled)
    def set_autocast_enabled(*args, **kwargs):
        if len(args) == 1 and "device_type" not in kwargs:   # the old one-argument form
            args = ("npu", args[0])
        elif "enabled" in kwargs and "device_type" not in kwargs and not args:
            kwargs["device_type"] = "npu"
        args, kwargs = _rewrite_call(args, kwargs, False)
        return set_enabled(*args, **kwargs)

    _set(torch, "is_autocast_enabled", is_autocast_enabled)
    _set(torch, "set_autocast_enabled", set_autocast_enabled)
    _wrap_all(torch, ("get_autocast_dtype", "set_autocast_dtype"))
    _set(torch, "get_autocast_gpu_dtype", torch_npu.npu.get_autocast_dtype)
    _set(torch, "set_autocast_gpu_dtype", torch_npu.npu.set_autocast_dtype)
    _wrap_all(torch.amp, ("custom_fwd", "custom_bwd"))
    _wrap_all(torch.fft, ("fftfreq", "rfftfreq"))
    _udev.DeviceContext.__init__ = _wrap_cuda(_udev.DeviceContext.__init__)
    import torch._utils as _tu
    _set(_tu, "_get_available_device_type", lambda: "npu")


def _patch_tensor_and_module() -> None:
    _wrap_all(torch.Tensor, TORCH_TENSOR_FN_WHITE_LIST)
    _set(torch.Tensor, "cuda", torch.Tensor.npu)
    _set(torch.Tensor, "is_cuda", torch.Tensor.is_npu)
    ts = torch.storage.TypedStorage
    if not hasattr(ts, "is_npu"):
        _set(ts, "is_npu", property(lambda self: self.device.type == "npu"))
    _set(ts, "is_cuda", ts.is_npu)
    _wrap_all(torch.nn.Module, TORCH_MODULE_FN_WHITE_LIST)
    _set(torch.nn.Module, "cuda", torch.nn.Module.npu)
    from torch.nn.parameter import UninitializedTensorMixin
    allowed = UninitializedTensorMixin._allowed_methods
    for i, m in enumerate(allowed):
        if getattr(m, "__name__", "") == "to":
            allowed[i] = torch.Tensor.to
            break


def _patch_distributed() -> None:
    _set(dist, "init_process_group", _wrap_hccl(_wrap_cuda(dist.init_process_group)))
    _set(dist, "is_nccl_available", torch_npu.distributed.is_hccl_available)
    dist.ProcessGroup._get_backend = _wrap_cuda(dist.ProcessGroup._get_backend)
    from torch.distributed import distributed_c10d as c10d
    _set(c10d, "_new_group_with_tag", _wrap_hccl(c10d._new_group_with_tag))
    pg_hccl = torch_npu._C._distributed_c10d.ProcessGroupHCCL
    _set(dist, "ProcessGroupNCCL", pg_hccl)
    _set(c10d, "ProcessGroupNCCL", pg_hccl)
    from torch.distributed import device_mesh
    device_mesh.DeviceMesh.__init__ = _wrap_cuda(device_mesh.DeviceMesh.__init__)
    _set(device_mesh, "init_device_mesh", _wrap_cuda(device_mesh.init_device_mesh))
    if hasattr(dist, "init_device_mesh"):
        _set(dist, "init_device_mesh", device_mesh.init_device_mesh)
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp
    fsdp.FullyShardedDataParallel.__init__ = _wrap_cuda(fsdp.FullyShardedDataParallel.__init__)
    from torch.distributed.pipelining import stage
    stage.PipelineStage.__init__ = _wrap_cuda(stage.PipelineStage.__init__)
    _wrap_all(stage, ("build_stage",))
    from torch.nn.parallel import DistributedDataParallel as DDP
    DDP.__init__ = _wrap_cuda(DDP.__init__)
    dmap = getattr(dist.Backend, "default_device_backend_map", None)
    if isinstance(dmap, dict):          # after the imports above (one registers a fake "cuda")
        dmap.pop("cuda", None)


def _patch_profiler() -> None:
    import torch.profiler as tp
    p = torch_npu.profiler
    profile = p.profile

    @functools.wraps(profile)
    def npu_profile(*args, **kwargs):
        cfg = kwargs.get("experimental_config")
        if cfg is not None and not isinstance(cfg, p._ExperimentalConfig):
            del kwargs["experimental_config"]      # a CUDA-only config, as torch_npu drops it
        return profile(*args, **kwargs)

    _set(tp, "profile", npu_profile)
    _set(tp, "schedule", p.schedule)
    _set(tp, "tensorboard_trace_handler", p.tensorboard_trace_handler)
    _set(tp, "ProfilerAction", p.ProfilerAction)
    _wrap_all(p._KinetoProfile, ("export_memory_timeline",))
    for name, member in (("CUDA", p.ProfilerActivity.NPU), ("CPU", p.ProfilerActivity.CPU)):
        try:
            setattr(tp.ProfilerActivity, name, member)
        except (AttributeError, TypeError):       # a C++ enum that refuses: use torch_npu's
            _set(tp, "ProfilerActivity", p.ProfilerActivity)
            break


def _apply() -> None:
    _patch_cuda()
    _patch_torch()
    _patch_tensor_and_module()
    _patch_distributed()
    _patch_profiler()


if not getattr(torch.cuda, "_npusim_transferred", False):
    _apply()
    torch.cuda._npusim_transferred = True
