"""Every environment knob of hccl, read in one place.

A communicator reads the knobs of its collectives (HCCL_ALGO, the slice size,
HCCL_EXEC_TIMEOUT) once, at its first use of them, and keeps them.

Names and units follow HCCL. A bad value raises ``InvalidArgumentError`` naming the variable, the
value and what is expected, instead of being silently replaced by the default.
"""
from __future__ import annotations

import ipaddress
import logging
import os

from hccl.errors import InvalidArgumentError
from runtime import config as runtime_config
from runtime.config import Job
from runtime.log import LEVELS

MiB = 1 << 20


def _raw(name: str) -> str | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip()


def _switch(name: str, unset: str) -> bool | None:
    """An on/off knob: True for 1 (on, true, yes), False for 0 (off, false, no), None when
    unset; anything else raises, ``unset`` saying what leaving it out means."""
    raw = _raw(name)
    if raw is None:
        return None
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise InvalidArgumentError(f"{name}={raw!r} must be 1 or 0; {unset}")


def _number(name: str, default: float, unit: str, example: str) -> float:
    raw = _raw(name)
    if raw is None:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise InvalidArgumentError(
            f"{name}={raw!r} is not a positive number of {unit}; unset it or set e.g. {example}")
    return value


def _int(name: str, default: int, minimum: int, what: str) -> int:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InvalidArgumentError(
            f"{name}={raw!r} is not {what} (an integer >= {minimum}); unset it to use {default}")
    return value


def connect_timeout() -> float:
    """HCCL_CONNECT_TIMEOUT: seconds for communicator init and link setup (default 120)."""
    return _number("HCCL_CONNECT_TIMEOUT", 120, "seconds", "HCCL_CONNECT_TIMEOUT=120")


def exec_timeout() -> float:
    """HCCL_EXEC_TIMEOUT: seconds of the longest wait for a peer in a collective (default 1800)."""
    return _number("HCCL_EXEC_TIMEOUT", 1800, "seconds", "HCCL_EXEC_TIMEOUT=1800")


def liveness_interval() -> float:
    """NPUSIM_LIVENESS_INTERVAL: seconds between two checks, by a rank waiting for a peer, that the
    peer is still alive (default 0.5). A dead peer is reported within about this plus 2 s."""
    return _number("NPUSIM_LIVENESS_INTERVAL", 0.5, "seconds", "NPUSIM_LIVENESS_INTERVAL=0.5")


def heartbeat_timeout() -> float:
    """NPUSIM_HEARTBEAT_TIMEOUT: seconds without any answer from a peer of another node after
    which its connection is declared broken (default 10; ZeroMQ heartbeats every fifth of it)."""
    return _number("NPUSIM_HEARTBEAT_TIMEOUT", 10, "seconds", "NPUSIM_HEARTBEAT_TIMEOUT=10")


def buffsize_mb() -> int:
    """HCCL_BUFFSIZE: staging/pipelining buffer size in MB (default 200, at least 1)."""
    return _int("HCCL_BUFFSIZE", 200, 1, "a size in MB")


WIRE_SLICE_DEFAULT = 8 * MiB


def wire_slice_bytes() -> int:
    """NPUSIM_WIRE_SLICE_BYTES: largest message put on the wire (default 8 MiB, npusim only).

    ZeroMQ over loopback moves 2+ GB/s with messages of a few MiB but about 1 GB/s with 32-64 MiB
    ones (every such message is a fresh mmap'd allocation on the receiver: glibc never reuses
    blocks above 32 MiB), so a chunk is sliced at this size even when HCCL_BUFFSIZE is larger.
    """
    return _int("NPUSIM_WIRE_SLICE_BYTES", WIRE_SLICE_DEFAULT, 1, "a size in bytes")


def slice_bytes() -> int:
    """Largest piece of a chunk sent as one message: HCCL_BUFFSIZE MB, at most
    ``wire_slice_bytes()``.

    ``NPUSIM_SLICE_BYTES`` (bytes, npusim only) overrides both, so tests can exercise slicing and
    pipelining with small buffers.
    """
    override = _int("NPUSIM_SLICE_BYTES", 0, 1, "a size in bytes")
    return override if override else min(buffsize_mb() * MiB, wire_slice_bytes())


def intra_roce() -> bool:
    """HCCL_INTRA_ROCE_ENABLE: 1 sends between the ranks of one node over the network path
    (sockets), as between nodes; 0 (default) uses shared memory inside a node."""
    raw = _raw("HCCL_INTRA_ROCE_ENABLE")
    if raw is None or raw == "0":
        return False
    if raw == "1":
        return True
    raise InvalidArgumentError(f"HCCL_INTRA_ROCE_ENABLE={raw!r} must be 0 or 1; unset it to use 0")


def shm() -> bool:
    """NPUSIM_SHM: 1 (default) lets ranks of one node talk through shared memory (rings for
    messages, in-place reads of each other's device memory); 0 sends everything over the
    sockets, as does HCCL_INTRA_ROCE_ENABLE=1."""
    if intra_roce():
        return False
    value = _switch("NPUSIM_SHM", "unset it to use 1")
    return True if value is None else value


def shm_min_bytes() -> int:
    """NPUSIM_SHM_MIN_BYTES: the smallest payload sent through shared memory (default 512 KiB;
    below it a copy through the socket costs less than the notice and its acknowledgement)."""
    return _int("NPUSIM_SHM_MIN_BYTES", 512 << 10, 1, "a size in bytes")


def shm_slots() -> int:
    """NPUSIM_SHM_SLOTS: slots of each intra-node ring (default 32); a sender that finds the
    ring full sends over the socket instead of waiting."""
    return _int("NPUSIM_SHM_SLOTS", 32, 1, "a number of slots")


def shm_slot_bytes() -> int:
    """NPUSIM_SHM_SLOT_BYTES: bytes of one ring slot, header included (default 64 KiB + 128, a
    multiple of 64): payloads up to it minus 96 bytes are copied through the ring, larger ones in
    device memory are read in place by the receiver."""
    value = _int("NPUSIM_SHM_SLOT_BYTES", (64 << 10) + 128, 128, "a size in bytes")
    if value % 64:
        raise InvalidArgumentError(f"NPUSIM_SHM_SLOT_BYTES={value} must be a multiple of 64")
    return value


def shm_spin_us() -> float | None:
    """NPUSIM_SHM_SPIN_US: microseconds a waiter spins before it sleeps (default: 200, or 0
    when the node runs more ranks than this process may use cores)."""
    if _raw("NPUSIM_SHM_SPIN_US") is None:
        return None
    raw = _raw("NPUSIM_SHM_SPIN_US")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e6:
        raise InvalidArgumentError(f"NPUSIM_SHM_SPIN_US={raw!r} is not a number of microseconds "
                                   "in [0, 1000000); unset it for the default")
    return value


def job() -> Job:
    """The job this process belongs to (``runtime.config.Job``: job id, attempt, rank, world
    size, ...), read from the environment in one place; a set variable that is not an integer
    raises InvalidArgumentError naming it."""
    try:
        return runtime_config.job()
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None


def job_secret() -> bytes | None:
    """NPUSIM_JOB_SECRET (set by npurun, hex): the key every message of the job is signed with;
    None when unset (not an npusim job)."""
    raw = _raw("NPUSIM_JOB_SECRET")
    if raw is None:
        return None
    try:
        return bytes.fromhex(raw)
    except ValueError:
        raise InvalidArgumentError("NPUSIM_JOB_SECRET must be hex (npurun sets it)") from None


def algo_set() -> bool:
    """True when HCCL_ALGO is set (then it is obeyed for every size; unset, small AllReduces
    use the one-shot schedule)."""
    return _raw("HCCL_ALGO") is not None


def algo() -> str:
    """HCCL_ALGO: algorithm name (default "ring").

    Accepts a plain name (``ring``) or HCCL's per-level form (``level0:NA;level1:ring``), in which
    case the highest level that names an algorithm wins. The name is checked against the
    schedule registry by ``hccl.schedule.algorithms``.
    """
    raw = _raw("HCCL_ALGO")
    if raw is None:
        return "ring"
    if ":" not in raw:
        return raw.lower()
    chosen = None
    for part in raw.split(";"):
        level, sep, name = part.partition(":")
        name = name.strip().lower()
        if not sep or not level.strip().lower().startswith("level") or not name:
            raise InvalidArgumentError(
                f"HCCL_ALGO={raw!r}: {part!r} is not 'levelN:algorithm'; use e.g. HCCL_ALGO=ring")
        if name != "na":
            chosen = name
    if chosen is None:
        raise InvalidArgumentError(f"HCCL_ALGO={raw!r} names no algorithm; use e.g. HCCL_ALGO=ring")
    return chosen


def if_ip() -> str | None:
    """HCCL_IF_IP: the address to bind and advertise (default: None, meaning loopback/auto)."""
    raw = _raw("HCCL_IF_IP")
    if raw is None:
        return None
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise InvalidArgumentError(
            f"HCCL_IF_IP={raw!r} is not an IP address; set e.g. HCCL_IF_IP=10.0.0.5") from None


def log_level() -> int:
    """ASCEND_GLOBAL_LOG_LEVEL: 0 debug, 1 info, 2 warning, 3 error (default), 4 off (parsed by
    ``runtime.config.log_level``; a bad value raises InvalidArgumentError)."""
    try:
        return runtime_config.log_level()
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None


def logging_level() -> int:
    """``log_level()`` as a ``logging`` module level."""
    return LEVELS[log_level()]


def trace_buffer() -> int:
    """NPUSIM_TRACE_BUFFER: collective records kept by the flight recorder (default 2000)."""
    return _int("NPUSIM_TRACE_BUFFER", 2000, 0, "a number of records")


# -- the job npusim's launcher (or launcher.spawn) started this process in ------------------------
def diag_enabled() -> bool:
    """NPUSIM_DIAG=1 (set by npurun): publish this rank's state to the job store."""
    return os.environ.get("NPUSIM_DIAG") == "1"


def diag_interval() -> float:
    """NPUSIM_DIAG_INTERVAL: seconds between two publications of the rank's state (default 0.5)."""
    return _number("NPUSIM_DIAG_INTERVAL", 0.5, "seconds", "NPUSIM_DIAG_INTERVAL=0.5")


def flight_file() -> str | None:
    """NPUSIM_FLIGHT_FILE: where a failing collective dumps the flight recorder (npurun sets it)."""
    return _raw("NPUSIM_FLIGHT_FILE")


def job_rank() -> int:
    """RANK: this process's rank in the job (0 outside a launcher)."""
    return _int("RANK", 0, 0, "a rank")


def node_rank() -> str | None:
    """GROUP_RANK: this node's index in the job (None outside a launcher)."""
    return _raw("GROUP_RANK")

