"""The user's call site (file:line in function) of a runtime call, skipping library frames."""
from __future__ import annotations

import os
import sys

_internal: tuple = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
_inside: dict = {}           # file name -> under _internal (str keys hash once: no prefix tests)
# (id(code), instruction offset) -> formatted site: a hot call site is formatted once, and a hit
# needs neither the line number (a walk of the code's line table, ~1.5 us deep in a 200-line
# function) nor a hash of the code object. _codes keeps each code object alive, so its id is
# not reused while its entries exist.
_cache: dict = {}
_codes: dict = {}


def add_internal(path: str) -> None:
    """Treat frames from files under ``path`` as library frames (hccl registers itself)."""
    global _internal
    p = os.path.abspath(path).rstrip(os.sep) + os.sep
    if p not in _internal:
        _internal = _internal + (p,)
        _inside.clear()
        _cache.clear()          # a cached site may be in the new folder
        _codes.clear()


def callsite(skip: int = 2) -> str:
    """``file:line in function`` of the first frame outside the registered library folders."""
    try:
        f = sys._getframe(skip)
    except ValueError:
        return "?"
    while f is not None:
        code = f.f_code
        key = (id(code), f.f_lasti)
        site = _cache.get(key)
        if site is not None:
            return site
        name = code.co_filename
        inside = _inside.get(name)
        if inside is None:
            if len(_inside) > 4096:
                _inside.clear()
            inside = _inside[name] = name.startswith(_internal)
        if not inside:
            if len(_cache) > 4096:
                _cache.clear()
                _codes.clear()
            _codes[key[0]] = code
            site = _cache[key] = f"{name}:{f.f_lineno} in {code.co_name}"
            return site
        f = f.f_back
    return "?"
