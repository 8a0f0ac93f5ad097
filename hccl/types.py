"""HCCL enumerations: data types, reduce ops, result codes, collective kinds, fingerprints.

Values are HCCL's own (``hccl_types.h``), so a number in a log or on the wire means what an HCCL
user expects. Every enum prints as its name (``str(DataType.FP32) == "FP32"``), also under Python
3.11 where ``IntEnum`` would otherwise print the number.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from hccl.errors import InvalidArgumentError
from hccl.result import NamedIntEnum, Result
from runtime.dtypes import DtypeMap

__all__ = ["DataType", "Fingerprint", "OpType", "ReduceOp", "Result", "describe_call"]


class _NamedIntEnum(NamedIntEnum):
    """An enumeration that parses its members, codes and names (E_PARA otherwise)."""

    @classmethod
    def of(cls, x):
        """Resolve a member, its int value, or its name (case-insensitive); raise E_PARA
        (``unknown reduce op ...``: the class's name in words) otherwise."""
        if isinstance(x, cls):
            return x
        if isinstance(x, str):
            member = cls.__members__.get(x.strip().upper())
            if member is not None:
                return member
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            try:
                return cls(int(x))
            except ValueError:
                pass
        what = re.sub("(?<=[a-z])(?=[A-Z])", " ", cls.__name__).lower()   # "ReduceOp": reduce op
        valid = ", ".join(cls.__members__)
        raise InvalidArgumentError(f"unknown {what} {x!r}; valid: {valid}")


class DataType(_NamedIntEnum):
    """HcclDataType. ``DataType.of`` also accepts numpy dtypes and dtype names."""

    INT8 = 0
    INT16 = 1
    INT32 = 2
    FP16 = 3
    FP32 = 4
    INT64 = 5
    UINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    FP64 = 10
    BFP16 = 11

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype of this data type (bfloat16 is ``ml_dtypes.bfloat16``)."""
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _TO_NUMPY[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in (DataType.FP16, DataType.FP32, DataType.FP64, DataType.BFP16)

    @classmethod
    def of(cls, x) -> "DataType":
        """Resolve a DataType, a numpy dtype (or scalar type), or a name.

        Names may be HCCL's (``"FP32"``, ``"BFP16"``), numpy's (``"float32"``, ``"bfloat16"``) or
        common short ones (``"fp16"``, ``"bf16"``); an array stands for its dtype. Raises
        ``InvalidArgumentError`` (E_PARA) for anything else, e.g. bool or complex dtypes, which
        HCCL does not reduce.
        """
        if isinstance(x, cls):
            return x
        if isinstance(x, str):
            key = x.strip().lower()
            if key in _ALIASES:
                return _ALIASES[key]
            if key.upper() in cls.__members__:
                return cls.__members__[key.upper()]
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            return super().of(x)
        elif (not isinstance(x, (type, np.dtype))
              and isinstance(getattr(x, "dtype", None), np.dtype)):
            x = x.dtype  # an array (numpy or DeviceArray)
        try:
            dt = np.dtype(x)
        except (TypeError, ValueError):
            dt = None
        if dt is not None and dt in _FROM_NUMPY:
            return _FROM_NUMPY[dt]
        valid = ", ".join(f"{m.name} ({_TO_NUMPY[m].name})" for m in cls)
        raise InvalidArgumentError(f"unsupported data type {x!r}; HCCL supports {valid}")


_TO_NUMPY: dict[DataType, np.dtype] = DtypeMap({
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32),
    DataType.INT64: np.dtype(np.int64),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.FP64: np.dtype(np.float64),
    DataType.BFP16: "bfloat16",     # ml_dtypes, imported on first use (runtime/dtypes.py)
})
_FROM_NUMPY: dict[np.dtype, DataType] = _TO_NUMPY.inverse()
# numpy dtype -> DataType or None, a plain lookup (never imports ml_dtypes): the Comm methods' path
from_numpy = _FROM_NUMPY.get
# Byte-order variants (">f4") are not supported: device memory is little endian.
_ALIASES: dict[str, DataType] = _TO_NUMPY.by_name()
_ALIASES.update({
    "fp16": DataType.FP16, "half": DataType.FP16, "fp32": DataType.FP32,
    "fp64": DataType.FP64, "double": DataType.FP64, "bf16": DataType.BFP16,
})


class ReduceOp(_NamedIntEnum):
    """HcclReduceOp."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3


class OpType(_NamedIntEnum):
    """Kind of a collective (or point-to-point) call, as it appears in fingerprints and reports."""

    ALLREDUCE = 0
    ALLGATHER = 1
    REDUCE_SCATTER = 2
    BROADCAST = 3
    REDUCE = 4
    ALLTOALL = 5
    SEND = 6
    RECV = 7
    BARRIER = 8

    @classmethod
    def of(cls, x) -> "OpType":
        """Resolve an OpType, its int value or its name (``"ALLREDUCE"``, also ``"all_reduce"``)."""
        if isinstance(x, str):
            x = x.replace("_", "").upper().replace("REDUCESCATTER", "REDUCE_SCATTER")
        return super().of(x)

    @property
    def reduces(self) -> bool:
        """True when the op combines data with a ReduceOp."""
        return self in (OpType.ALLREDUCE, OpType.REDUCE_SCATTER, OpType.REDUCE)

    @property
    def rooted(self) -> bool:
        """True when the op has a root rank."""
        return self in (OpType.BROADCAST, OpType.REDUCE)


class Fingerprint(NamedTuple):
    """What every rank must agree on for one collective: (op, count, dtype, redop, root).

    A tuple of five ints, so it goes on the wire as it is (``hccl.wire`` packs 5 int64s).
    ``redop`` and ``root`` are -1 for ops that do not use them; ``count`` is the per-rank count of
    the HCCL call (send_count / recv_count as the API names it). ``str(fp)`` reads like
    ``ALLREDUCE(count=1024, FP32, SUM)``.
    """

    op: int
    count: int
    dtype: int
    redop: int = -1
    root: int = -1

    @classmethod
    def make(cls, op, count: int, dtype=None, redop=None, root=None) -> "Fingerprint":
        """Normalise arguments; redop/root that the op does not use become -1."""
        op = OpType.of(op)
        dtype = DataType.of(dtype) if dtype is not None else DataType.UINT8
        redop = ReduceOp.of(redop) if (op.reduces and redop is not None) else -1
        root = int(root) if (op.rooted and root is not None) else -1
        return cls(op, int(count), dtype, redop, root)

    @classmethod
    def from_wire(cls, values) -> "Fingerprint":
        """Rebuild from five ints (e.g. a received header); unknown codes stay plain ints."""
        op, count, dtype, redop, root = (int(v) for v in values)
        return cls(_maybe(OpType, op), count, _maybe(DataType, dtype),
                   _maybe(ReduceOp, redop) if redop >= 0 else -1, root)

    def __str__(self) -> str:
        return describe_call(self.op, self.count, self.dtype, self.redop, self.root)


def describe_call(op, count, dtype, redop=None, root=None, **context) -> str:
    """A collective call as users read it everywhere: ``ALLREDUCE(count=1024, FP32, SUM)``, or with
    ``context`` first: ``ALLREDUCE(comm=world, seq=2, count=1024, FP32, SUM)``.

    ``op``, ``dtype`` and ``redop`` are enum members, their codes or their names (a flight record);
    ``redop`` / ``root`` of None, -1 or "" are left out, and so are count and dtype of a barrier.
    """
    op = _name(OpType, op)
    parts = [f"{k}={v}" for k, v in context.items()]
    if op != "BARRIER":
        parts += [f"count={count}", _name(DataType, dtype)]
        if redop not in (None, -1, ""):
            parts.append(_name(ReduceOp, redop))
        if root not in (None, -1, ""):      # an AllReduce's root: a fused group's size
            parts.append(f"{'fused' if op == 'ALLREDUCE' else 'root'}={root}")
    return f"{op}({', '.join(parts)})"


def _name(cls, value) -> str:
    """The member name for a member or its code; anything else as text."""
    if isinstance(value, str):
        return value
    try:
        return str(_maybe(cls, int(value)))
    except (TypeError, ValueError):
        return "?" if value is None else str(value)


def _maybe(cls, value: int):
    try:
        return cls(value)
    except ValueError:
        return int(value)
