"""The pool's arguments: the page policies of ``malloc``, size and policy checks, sizes as text."""
from __future__ import annotations

import enum
import operator

from .blocks import LARGE_HUGE, LARGE_NORMAL, SMALL
from ..errors import InvalidParamError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


class MemMallocPolicy(enum.IntEnum):
    """Page policy of ``malloc``; the values are ACL's ``aclrtMemMallocPolicy``."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2


LARGE_KINDS = {
    MemMallocPolicy.HUGE_FIRST: (LARGE_HUGE, LARGE_NORMAL),
    MemMallocPolicy.HUGE_ONLY: (LARGE_HUGE,),
    MemMallocPolicy.NORMAL_ONLY: (LARGE_NORMAL,),
}
SMALL_KINDS = (SMALL,)


def format_size(nbytes: int) -> str:
    """Human-readable size with two decimals: ``512 B``, ``1.50 KiB``, ``3.00 GiB``."""
    if nbytes < KiB:
        return f"{nbytes} B"
    for unit, scale in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"  # unreachable


def check_nbytes(nbytes) -> int:
    """Return ``nbytes`` as an int > 0 or raise InvalidParamError (slow path of malloc)."""
    if isinstance(nbytes, bool) or isinstance(nbytes, float):
        raise InvalidParamError(
            f"malloc: nbytes={nbytes!r} must be an int > 0 (got {type(nbytes).__name__})")
    try:
        n = operator.index(nbytes)
    except TypeError:
        raise InvalidParamError(
            f"malloc: nbytes={nbytes!r} must be an int > 0 (got {type(nbytes).__name__})") from None
    if n <= 0:
        raise InvalidParamError(
            f"malloc: nbytes={n} must be > 0; zero-size and negative allocations are not allowed "
            f"(zero-size arrays take no device memory: do not malloc them)")
    return n


def policy_kinds(policy) -> tuple:
    """Large-pool kinds of a policy (a MemMallocPolicy or its ACL int), or InvalidParamError."""
    kinds = None
    if not isinstance(policy, (bool, float)):
        try:
            kinds = LARGE_KINDS.get(operator.index(policy))
        except TypeError:
            pass
    if kinds is None:
        valid = ", ".join(f"MemMallocPolicy.{p.name} ({p.value})" for p in MemMallocPolicy)
        raise InvalidParamError(f"malloc: unknown policy={policy!r}; valid policies: {valid}")
    return kinds
