"""torch's hooks and device guard for the npu device (what a C++ backend registers)."""
from __future__ import annotations

import torch

import runtime

from . import device as _device


class Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class DeviceGuard(torch._C._acc.DeviceGuard):
    """torch's device guard calls these (the autograd engine sizes its per-device queues with
    ``device_count``)."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1

    def device_count(self) -> int:
        return runtime.device_count()

    def get_device(self) -> int:
        return _device.current()

    def set_device(self, index) -> None:
        runtime.set_device(int(index))

    def exchangeDevice(self, index) -> int:
        prev = _device.current()
        if int(index) != prev:
            runtime.set_device(int(index))
        return prev
