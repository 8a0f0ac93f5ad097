"""HcclResult codes, and the enum base of every hccl enumeration (it prints as its name).

Its own module so that ``errors`` (which carries a code) and ``types`` (whose parsers raise an
error) both import it and neither imports the other's importer: no cycle.
"""
from __future__ import annotations

import enum


class NamedIntEnum(enum.IntEnum):
    """An IntEnum that prints and formats as its name."""

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)

    # An int's hash, in C: Enum's own hashes the member's name in Python (0.25 us), and every
    # eager call hashes two members in the key of its remembered Call (hccl.call.Calls). It is
    # also the hash an equal int has, as a dict key must.
    __hash__ = int.__hash__


class Result(NamedIntEnum):
    """HcclResult codes."""

    SUCCESS = 0
    E_PARA = 1
    E_PTR = 2
    E_MEMORY = 3
    E_INTERNAL = 4
    E_NOT_SUPPORT = 5
    E_NOT_FOUND = 6
    E_UNAVAIL = 7
    E_SYSCALL = 8
    E_TIMEOUT = 9
    E_OPEN_FILE_FAILURE = 10
    E_TCP_CONNECT = 11
    E_ROCE_CONNECT = 12
    E_TCP_TRANSFER = 13
    E_ROCE_TRANSFER = 14
    E_RUNTIME = 15
    E_DRV = 16
    E_PROFILING = 17
    E_CCE = 18
    E_NETWORK = 19
    E_AGAIN = 20
    E_REMOTE = 21
