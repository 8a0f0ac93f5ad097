"""Every environment knob of the runtime, read in one place."""
from __future__ import annotations

import os

GiB = 1 << 30


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw, 0)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def device_count() -> int:
    """NPUSIM_DEVICE_COUNT: number of simulated NPUs on this node (default 8)."""
    return _int("NPUSIM_DEVICE_COUNT", 8)


def hbm_bytes() -> int:
    """NPUSIM_HBM_BYTES: capacity of each simulated NPU (default 16 GiB)."""
    return _int("NPUSIM_HBM_BYTES", 16 * GiB)


def profile_dir() -> str | None:
    """NPUSIM_PROFILE_DIR: write a Chrome trace of every task into this directory."""
    return os.environ.get("NPUSIM_PROFILE_DIR") or None


def log_level() -> int:
    """ASCEND_GLOBAL_LOG_LEVEL: 0 debug, 1 info, 2 warning, 3 error (default)."""
    return _int("ASCEND_GLOBAL_LOG_LEVEL", 3)


def local_rank() -> int:
    """LOCAL_RANK: the device ``set_device()`` takes without an argument (0 without a launcher)."""
    return _int("LOCAL_RANK", 0)


def rank() -> str | None:
    """RANK: this process's global rank when a launcher started it (labels logs and traces)."""
    return os.environ.get("RANK")


def job_id() -> str:
    """NPUSIM_JOB_ID: names the job's shared-memory segments (set by npurun)."""
    return os.environ.get("NPUSIM_JOB_ID") or f"p{os.getpid()}"


def stream_check() -> str:
    """NPUSIM_STREAM_CHECK: the stream sanitizer's mode (runtime/sanitizer.py): "raise" (1, on,
    raise: a race raises StreamRaceError), "warn" (reports and goes on) or "off" (unset, 0, off)."""
    raw = os.environ.get("NPUSIM_STREAM_CHECK", "").strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return "off"
    if raw in ("1", "on", "raise", "true", "yes"):
        return "raise"
    if raw == "warn":
        return "warn"
    raise ValueError(f"NPUSIM_STREAM_CHECK={raw!r}: expected 1 (raise), warn or 0 (off)")


def sched_batch() -> bool | None:
    """NPUSIM_SCHED_BATCH: 1 runs npusim's work in Linux's SCHED_BATCH class (a thread that wakes
    another keeps its core until it waits itself), 0 never changes a scheduling class; unset
    (None): collectives run in SCHED_BATCH when the node's ranks outnumber its cores, and stream
    workers move themselves when their wake-ups find their work taken (see runtime/sched.py).
    Raises ValueError for anything but 1/0 (on/off, true/false, yes/no)."""
    raw = os.environ.get("NPUSIM_SCHED_BATCH", "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"NPUSIM_SCHED_BATCH={raw!r} must be 1 or 0; unset it for the default "
                     "(SCHED_BATCH when the node's ranks outnumber its cores)")
