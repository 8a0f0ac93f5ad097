"""torch.npu.aclnn: the aclnn operator flags torch_npu exposes (``allow_hf32``, ``flags``).

As torch_npu's module, ``torch.npu.aclnn.allow_hf32`` reads and sets the ALLOW_CONV_HF32 option
(shared with ``torch.npu.conv.allow_hf32``) and ``with torch.npu.aclnn.flags(allow_hf32=...)``
sets it for a block. Recorded and read back; npusim's convolutions are torch's CPU kernels in
fp32 whatever it says. ``version()`` is None with a warning, as torch_npu's.
"""
from __future__ import annotations

import contextlib
import sys
import types
import warnings

from . import options as _options

__all__ = ["version", "allow_hf32"]


def _get_allow_hf32() -> bool:
    return _options.conv.allow_hf32


def _set_allow_hf32(enabled: bool) -> None:
    _options.conv.allow_hf32 = enabled


def set_flags(_allow_hf32=None):
    """Set the flags given (None: unchanged); returns the previous ones as a tuple."""
    orig = (_get_allow_hf32(),)
    if _allow_hf32 is not None:
        _set_allow_hf32(_allow_hf32)
    return orig


@contextlib.contextmanager
def flags(allow_hf32: bool = True):
    """``with torch.npu.aclnn.flags(allow_hf32=False):`` the flag for the block, restored after."""
    orig = set_flags(allow_hf32)
    try:
        yield
    finally:
        set_flags(*orig)


def version():
    """None: torch_npu reports no aclnn version either (it warns the same)."""
    warnings.warn("torch.npu.aclnn.version isn't implemented!")
    return None


class _AclnnModule(types.ModuleType):
    @property
    def allow_hf32(self) -> bool:
        return _get_allow_hf32()

    @allow_hf32.setter
    def allow_hf32(self, value) -> None:
        _set_allow_hf32(value)


sys.modules[__name__].__class__ = _AclnnModule
