"""The user's call site (file:line in function) of a runtime call, skipping library frames."""
from __future__ import annotations

import os
import sys

_internal: tuple = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
_inside: dict = {}           # file name -> under _internal (str keys hash once: no prefix tests)
_cache: dict = {}            # (file, line, function) -> formatted site: hot sites format once


def add_internal(path: str) -> None:
    """Treat frames from files under ``path`` as library frames (hccl registers itself)."""
    global _internal
    p = os.path.abspath(path).rstrip(os.sep) + os.sep
    if p not in _internal:
        _internal = _internal + (p,)
        _inside.clear()


def callsite(skip: int = 2) -> str:
    """``file:line in function`` of the first frame outside the registered library folders."""
    try:
        f = sys._getframe(skip)
    except ValueError:
        return "?"
    while f is not None:
        code = f.f_code
        name = code.co_filename
        inside = _inside.get(name)
        if inside is None:
            if len(_inside) > 4096:
                _inside.clear()
            inside = _inside[name] = name.startswith(_internal)
        if not inside:
            key = (name, f.f_lineno, code.co_name)
            site = _cache.get(key)
            if site is None:
                if len(_cache) > 4096:
                    _cache.clear()
                site = _cache[key] = f"{name}:{key[1]} in {key[2]}"
            return site
        f = f.f_back
    return "?"
