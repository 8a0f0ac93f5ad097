"""Element-wise reductions used by the collectives, in place and without Python loops.

Integers wrap exactly as numpy (and two's-complement hardware) do. fp16 and bf16 are computed the
way accelerators do it: widened to fp32, combined, and rounded back to nearest-even once per
reduction step. fp32 and fp64 use numpy's native ufuncs.
"""
from __future__ import annotations

import numpy as np

from hccl.types import DataType, ReduceOp
from runtime.dtypes import DtypeSet

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MAX: np.maximum,
    ReduceOp.MIN: np.minimum,
}
WIDENED = DtypeSet("float16", "bfloat16")   # reduced in fp32, rounded back; never imports ml_dtypes
# Elements widened at once for fp16/bf16: bounds the fp32 temporaries (2 x 1 MiB) and keeps them
# in cache.
_BLOCK = 1 << 18


def ufunc(op: ReduceOp) -> np.ufunc:
    """The numpy ufunc of a ReduceOp."""
    return _UFUNCS[ReduceOp.of(op)]


def reduce_into(dst: np.ndarray, src: np.ndarray, op: ReduceOp) -> None:
    """``dst = op(dst, src)`` element-wise, in place.

    ``dst`` and ``src`` must have the same dtype and number of elements (``src`` may be
    read-only, e.g. ``np.frombuffer`` over a received message). Raises ``ValueError`` otherwise.
    """
    fn = _UFUNCS[ReduceOp.of(op)]
    if dst.dtype != src.dtype or dst.size != src.size:
        raise ValueError(f"reduce_into: dst {dst.dtype}[{dst.size}] and src {src.dtype}[{src.size}]"
                         " must have the same dtype and size")
    if dst.shape != src.shape:
        src = src.reshape(dst.shape)
    if dst.dtype in WIDENED:
        _reduce_widened(dst.reshape(-1), src.reshape(-1), fn)
    else:
        fn(dst, src, out=dst)


def reduce3(dst: np.ndarray, a: np.ndarray, b: np.ndarray, op: ReduceOp) -> None:
    """``dst = op(a, b)`` element-wise: the same bytes as copying ``a`` into ``dst`` and then
    ``reduce_into(dst, b, op)``, without the copy. All three flat, of one dtype and size
    (``dst`` may be ``a``; ``b`` may be read-only). Raises ``ValueError`` otherwise."""
    fn = _UFUNCS[ReduceOp.of(op)]
    if not (dst.dtype == a.dtype == b.dtype and dst.size == a.size == b.size):
        raise ValueError(f"reduce3: dst {dst.dtype}[{dst.size}], a {a.dtype}[{a.size}] and b "
                         f"{b.dtype}[{b.size}] must have the same dtype and size")
    if dst.dtype in WIDENED:
        _reduce_widened(dst.reshape(-1), b.reshape(-1), fn, a.reshape(-1))
    else:
        fn(a, b, out=dst)


def _reduce_widened(dst: np.ndarray, src: np.ndarray, fn: np.ufunc, first=None) -> None:
    """fp16 / bf16: compute in fp32 block by block, round back to the storage type;
    ``dst = fn(first, src)`` when ``first`` is given, else ``dst = fn(dst, src)``."""
    n = dst.size
    a = dst if first is None else first
    wide = np.empty(min(n, _BLOCK), np.float32)
    other = np.empty_like(wide)
    for lo in range(0, n, _BLOCK):
        hi = min(n, lo + _BLOCK)
        w, o = wide[: hi - lo], other[: hi - lo]
        w[...] = a[lo:hi]
        o[...] = src[lo:hi]
        fn(w, o, out=w)
        dst[lo:hi] = w


def reduce_reference(arrays, op: ReduceOp, dtype=None) -> np.ndarray:
    """The exact-as-possible reduction of ``arrays`` (one per rank), for checking results.

    Integers are folded with wrap-around (exact, order-free). Floats are accumulated in float64
    and rounded once to the result dtype, so the reference carries no reassociation error of its
    own; compare float results within a tolerance. Returns a new array of the arrays' dtype.
    """
    fn = _UFUNCS[ReduceOp.of(op)]
    arrays = [np.asarray(a) for a in arrays]
    if not arrays:
        raise ValueError("reduce_reference needs at least one array")
    dt = np.dtype(dtype) if dtype is not None else arrays[0].dtype
    if DataType.of(dt).is_float:
        acc = arrays[0].astype(np.float64)
        for a in arrays[1:]:
            fn(acc, a.astype(np.float64), out=acc)
        return acc.astype(dt)
    acc = arrays[0].astype(dt, copy=True)
    for a in arrays[1:]:
        fn(acc, a.astype(dt, copy=False), out=acc)
    return acc
