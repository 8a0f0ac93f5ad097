"""pyACL's data buffers (aclDataBuffer): the calls Ascend's samples make around their model
inputs and outputs.

A data buffer is an integer handle that names a (pointer, size) pair; like pyACL, the getters
return plain values (``acl.get_data_buffer_addr(buf)`` is an int, 0 for a handle that is not
live) and ``destroy_data_buffer`` returns a ret code.
"""
from __future__ import annotations

import itertools

from . import codes as _c
from .codes import AclError, fail, int_arg, returns_ret

_buffers: dict = {}                 # handle -> (address, size)
_next = itertools.count(0x5000)


def create_data_buffer(data, size) -> int:
    """A data buffer handle for ``size`` bytes at pointer ``data`` (0 on a bad argument)."""
    try:
        addr, n = int_arg("data", data), int_arg("size", size)
        if n < 0:
            raise AclError(_c.ACL_ERROR_INVALID_PARAM, f"size={n} must be >= 0")
    except AclError as exc:
        fail("aclCreateDataBuffer", exc)
        return 0
    h = next(_next)
    _buffers[h] = (addr, n)
    return h


def _get(api: str, buf, index: int) -> int:
    item = _buffers.get(buf) if isinstance(buf, int) else None
    if item is None:
        fail(api, AclError(_c.ACL_ERROR_INVALID_PARAM,
                           f"data_buffer={buf!r} is not a live handle from acl.create_data_buffer"))
        return 0
    return item[index]


def get_data_buffer_addr(data_buffer) -> int:
    """The pointer a data buffer names (0 when the handle is not live)."""
    return _get("aclGetDataBufferAddr", data_buffer, 0)


def get_data_buffer_size(data_buffer) -> int:
    """The size in bytes a data buffer names (0 when the handle is not live)."""
    return _get("aclGetDataBufferSize", data_buffer, 1)


get_data_buffer_size_v2 = get_data_buffer_size


@returns_ret("aclDestroyDataBuffer")
def destroy_data_buffer(data_buffer):
    """Destroy the handle (not the memory it names, as in CANN)."""
    if _buffers.pop(data_buffer if isinstance(data_buffer, int) else None, None) is None:
        raise AclError(_c.ACL_ERROR_INVALID_PARAM,
                       f"data_buffer={data_buffer!r} is not a live handle (destroyed twice?)")


def clear() -> None:
    """Forget every handle (acl.finalize)."""
    _buffers.clear()

