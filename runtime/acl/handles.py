"""pyACL's integer handles for ``runtime.acl``: contexts, streams and events by number.

One table for the package: ``acl.rt.create_stream`` / ``create_event`` / ``create_context`` add
to it (``new``), every call that takes a handle looks it up (``lookup``, ``stream_of``), and
``acl.finalize`` clears it. ``lock`` is the one lock for handles and pointers (pointers.lock).
"""
from __future__ import annotations

import itertools

from . import codes as _c
from .codes import AclError
from .pointers import lock

import runtime as _rt

table: dict = {}                    # int handle -> _Context / Stream / Event
_next = itertools.count(0x1000)

__all__ = ["lock", "lookup", "new", "stream_of", "table"]


def new(obj) -> int:
    """A fresh handle for ``obj``."""
    h = next(_next)
    table[h] = obj
    return h


def lookup(handle, kind, what: str):
    """The live ``kind`` object behind ``handle``; AclError(ACL_ERROR_RT_INVALID_HANDLE) if none."""
    obj = table.get(handle) if isinstance(handle, int) else None
    if not isinstance(obj, kind):
        raise AclError(_c.ACL_ERROR_RT_INVALID_HANDLE,
                       f"{what}={handle!r} is not a live {what} handle: it was never created by "
                       f"acl.rt.create_{what}, or it was destroyed (or acl.finalize ran)")
    return obj


def stream_of(handle):
    """The runtime Stream for a stream handle; 0 / None is the current device's default stream."""
    if handle is None or (isinstance(handle, int) and handle == 0):
        return _rt.current_stream()
    return lookup(handle, _rt.Stream, "stream")
