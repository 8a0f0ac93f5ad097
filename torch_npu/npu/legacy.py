"""torch.npu's legacy tensor types (``torch.npu.FloatTensor`` ...) and typed storages.

DeepSpeed's NPU accelerator hands ``torch.npu.FloatTensor`` to its ZeRO overflow and norm code,
which calls it as a constructor (``FloatTensor([0.0])``: a float32 npu tensor on the current
NPU) and checks tensors against it with ``isinstance``. A type here is a class whose instances
are the npu tensors of its dtype: ``isinstance(t, torch.npu.FloatTensor)`` is True for a float32
tensor on any NPU (as ``torch.cuda.FloatTensor`` for CUDA tensors), and calling it takes the
arguments of torch's CPU legacy constructor (data, or sizes) and places the result on the current
NPU. ``t.type()`` of an npu tensor already names these (``'torch.npu.FloatTensor'``).

The typed storages (``torch.npu.FloatStorage`` ...) exist for ``isinstance`` and type lookups
only: npu tensors keep their bytes in ``torch.UntypedStorage`` (``tensor.untyped_storage()``),
and constructing a legacy typed storage raises a clear error saying so.
"""
from __future__ import annotations

import torch

_TYPES = {"FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
          "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
          "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64,
          "BoolTensor": torch.bool}
_CPU = {n: getattr(torch, n) for n in _TYPES}


class _LegacyTensorMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype

    def __call__(cls, *args, **kwargs):
        if "device" in kwargs:
            raise TypeError(f"torch.npu.{cls.__name__}() takes no device: it places its tensor "
                            "on the current npu device")
        from runtime.torch import device as _device
        cpu = _CPU[cls.__name__](*args, **kwargs)
        return cpu.to(torch.device("npu", _device.current()))

    def __repr__(cls):
        return f"<class 'torch.npu.{cls.__name__}'>"


def _tensor_type(name: str, dtype: torch.dtype):
    doc = (f"``torch.npu.{name}``: npu tensors of dtype {dtype}; called with data or sizes, a "
           f"new one on the current NPU (torch.{name}'s arguments).")
    return _LegacyTensorMeta(name, (), {"dtype": dtype, "is_npu": True, "is_sparse": False,
                                        "__doc__": doc, "__module__": "torch.npu"})


class _LegacyStorageMeta(type):
    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torch.npu.{cls.__name__}: typed npu storages are not supported by "
                           "npusim (as torch deprecates typed storages); an npu tensor's bytes "
                           "are a torch.UntypedStorage: use tensor.untyped_storage(), or make a "
                           "tensor with torch.empty(n, dtype=..., device='npu')")

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.TypedStorage) and obj.device.type == "npu" and \
            obj.dtype == cls.dtype


def _storage_type(name: str, dtype: torch.dtype):
    return _LegacyStorageMeta(name, (), {"dtype": dtype, "__module__": "torch.npu",
                                         "__doc__": f"torch.npu.{name} (no instances here)."})


tensor_types = {n: _tensor_type(n, d) for n, d in _TYPES.items()}
storage_types = {n.replace("Tensor", "Storage"): _storage_type(n.replace("Tensor", "Storage"), d)
                 for n, d in _TYPES.items()}
