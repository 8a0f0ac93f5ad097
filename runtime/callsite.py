"""The user's call site (file:line in function) of a runtime call, skipping library frames."""
from __future__ import annotations

import os
import sys

_internal: tuple = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
_cache: dict = {}            # (code, line) -> formatted site: hot call sites format once


def add_internal(path: str) -> None:
    """Treat frames from files under ``path`` as library frames (hccl registers itself)."""
    global _internal
    p = os.path.abspath(path).rstrip(os.sep) + os.sep
    if p not in _internal:
        _internal = _internal + (p,)


def callsite(skip: int = 2) -> str:
    """``file:line in function`` of the first frame outside the registered library folders."""
    try:
        f = sys._getframe(skip)
    except ValueError:
        return "?"
    internal = _internal
    while f is not None:
        code = f.f_code
        if not code.co_filename.startswith(internal):
            key = (code, f.f_lineno)
            site = _cache.get(key)
            if site is None:
                if len(_cache) > 4096:
                    _cache.clear()
                site = _cache[key] = f"{code.co_filename}:{f.f_lineno} in {code.co_name}"
            return site
        f = f.f_back
    return "?"
