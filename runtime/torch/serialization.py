"""torch.save / torch.load of npu tensors.

Saving copies an npu storage to the host (torch's own path works) and tags it ``npu:N``, the
NPU that held it. Loading places it as any new tensor (device.target): ``npu:0`` and ``npu`` are
the loading thread's current NPU, ``npu:N`` is NPU N. Loading onto ``npu`` would
make torch call ``torch.UntypedStorage(n, device="npu")``, which needs a C++ allocator a Python
backend does not have; this deserializer, registered ahead of torch's, allocates the storage
from npusim's pool instead (``torch.serialization.register_package``, the public route).
"""
from __future__ import annotations

import torch

from . import device as _device
from . import storage as S


def _tag(obj):
    if obj.device.type == "npu":
        return f"npu:{obj.device.index or 0}"
    return None


def _deserialize(obj, location: str):
    if not location.startswith("npu"):
        return None
    d = _device.target(location)
    n = obj.nbytes()
    with _device.on(d):
        if n == 0:
            return S.empty_strided((0,), (1,), torch.uint8, d).untyped_storage()
        st = S.new_storage_tensor(n, d).untyped_storage()
    st.copy_(obj, False)
    return st


def register() -> None:
    torch.serialization.register_package(5, _tag, _deserialize)
