"""The dtypes numpy lacks (bfloat16, the float8 family), from ml_dtypes, imported on first use.

Design note. ``import ml_dtypes`` costs 0.75-0.9 s of CPU here (its C extension registers a
dozen dtypes and their casts), more than the rest of ``import runtime`` and ``import hccl``
together, and every rank of a job paid it even when it never made a bfloat16 buffer. So nothing
in npusim imports it at import time; it is imported when one of its dtypes is first asked for
*by name* (``get("bfloat16")``, ``runtime.empty(n, "bfloat16")``, ``DataType.BFP16.numpy``).

A dtype *object* needs no import to be recognised: a process holding a bfloat16 array or
``ml_dtypes.bfloat16`` has imported ml_dtypes already. So the lookups by dtype (``is_extra``,
``DtypeSet.__contains__``, ``DtypeMap.inverse()``) consult ``sys.modules`` and never import:
they stay as cheap as a dict lookup on the hot path of a collective.
"""
from __future__ import annotations

import sys

import numpy as np

# names ml_dtypes gives a dtype of, which npusim accepts wherever a dtype name is taken
NAMES = frozenset({
    "bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
})

_resolved: dict[str, np.dtype] = {}      # name -> dtype, filled once ml_dtypes is in


def loaded() -> bool:
    """Whether ml_dtypes is imported in this process (by npusim or by the user)."""
    return "ml_dtypes" in sys.modules


def get(name: str) -> np.dtype:
    """The numpy dtype of extra dtype ``name`` (one of ``NAMES``); imports ml_dtypes the first
    time. Raises KeyError for another name, ImportError naming the package if it is missing."""
    dt = _resolved.get(name)
    if dt is not None:
        return dt
    if name not in NAMES:
        raise KeyError(f"{name!r} is not one of ml_dtypes' dtypes ({', '.join(sorted(NAMES))})")
    try:
        import ml_dtypes  # noqa: PLC0415 - the point of this module: on first use only
    except ImportError as e:
        raise ImportError(f"dtype {name!r} needs the ml_dtypes package (pip install ml_dtypes): "
                          f"{e}") from e
    _resolve_all(ml_dtypes)
    return _resolved[name]


def _resolve_all(mod) -> None:
    for n in NAMES:
        t = getattr(mod, n, None)         # an older ml_dtypes lacks the newest float8 kinds
        if t is not None and n not in _resolved:
            _resolved[n] = np.dtype(t)


def known() -> dict[str, np.dtype]:
    """The extra dtypes that exist in this process now, by name: empty until ml_dtypes is
    imported (by anyone); never imports it."""
    if len(_resolved) < len(NAMES) and loaded():
        _resolve_all(sys.modules["ml_dtypes"])
    return _resolved


def is_extra(dt: np.dtype) -> bool:
    """Whether numpy dtype ``dt`` is one of ml_dtypes' (never imports it)."""
    return dt.kind in "Vf" and dt in known().values()


class DtypeSet:
    """A set of dtypes given by name, some of them ml_dtypes' ones: ``dt in s`` compares with
    the dtypes that exist now, so it never imports ml_dtypes (a bfloat16 array cannot exist
    without it)."""

    __slots__ = ("_names", "_dtypes", "_pending")

    def __init__(self, *names: str):
        self._names = names
        self._dtypes: frozenset = frozenset(np.dtype(n) for n in names if n not in NAMES)
        self._pending = any(n in NAMES for n in names)

    def _refresh(self) -> bool:
        have = known()
        if not have:
            return False
        self._dtypes = self._dtypes | {have[n] for n in self._names if n in have}
        self._pending = False
        return True

    def __contains__(self, dt) -> bool:
        if dt in self._dtypes:
            return True
        return self._pending and self._refresh() and dt in self._dtypes

    def __repr__(self) -> str:
        return f"DtypeSet{self._names}"


class DtypeMap(dict):
    """``{key: numpy dtype}`` where a value given as an ml_dtypes name (``"bfloat16"``) becomes
    its dtype on first read: ``m[key]`` for such a key imports ml_dtypes then (``__missing__``,
    so reading a resolved key stays a plain dict lookup); so do ``values()`` and ``items()``.
    ``in``, iteration, ``len``, ``inverse()`` and ``by_name()`` never import it."""

    def __init__(self, entries: dict):
        super().__init__({k: v for k, v in entries.items() if not isinstance(v, str)})
        self._lazy = {k: v for k, v in entries.items() if isinstance(v, str)}

    def __missing__(self, key):
        name = self._lazy.get(key)
        if name is None:
            raise KeyError(key)
        value = get(name)
        dict.__setitem__(self, key, value)
        del self._lazy[key]
        return value

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in self._lazy

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __iter__(self):
        return iter([*dict.keys(self), *self._lazy])

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._lazy)

    def keys(self):
        return list(self)

    def values(self):
        return [self[k] for k in self]

    def items(self):
        return [(k, self[k]) for k in self]

    def by_name(self) -> dict:
        """``{dtype name: key}`` (``"float32"``, ``"bfloat16"``, ...)."""
        names = {v.name: k for k, v in dict.items(self)}
        names.update({v: k for k, v in self._lazy.items()})
        return names

    def inverse(self) -> "_DtypeIndex":
        """``{dtype: key}``, the ml_dtypes entries joining once ml_dtypes is imported."""
        return _DtypeIndex({v: k for k, v in dict.items(self)},
                           {v: k for k, v in self._lazy.items()})


class _DtypeIndex(dict):
    """``DtypeMap.inverse()``: a dict keyed by numpy dtype whose lazily named entries are added
    when ml_dtypes turns up in ``sys.modules`` (checked only on a miss)."""

    def __init__(self, entries: dict, pending: dict):
        super().__init__(entries)
        self._pending = pending            # ml_dtypes name -> key

    def _refresh(self) -> bool:
        have = known() if self._pending else None
        if not have:
            return False
        for name, key in list(self._pending.items()):
            if name in have:
                dict.__setitem__(self, have[name], key)
                del self._pending[name]
        return True

    def __contains__(self, dt) -> bool:
        return dict.__contains__(self, dt) or (self._refresh() and dict.__contains__(self, dt))

    def __missing__(self, dt):
        if self._refresh() and dict.__contains__(self, dt):
            return dict.__getitem__(self, dt)
        raise KeyError(dt)

    def get(self, dt, default=None):
        return self[dt] if dt in self else default
