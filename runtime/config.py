"""Every environment knob of the runtime, read in one place."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

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


LOG_LEVELS = (0, 1, 2, 3, 4)     # ASCEND_GLOBAL_LOG_LEVEL: debug, info, warning, error, off


def log_level() -> int:
    """ASCEND_GLOBAL_LOG_LEVEL: 0 debug, 1 info, 2 warning, 3 error (default), 4 off. The one
    parser of it: hccl.config and launcher.config call this. Raises ValueError naming the value."""
    raw = (os.environ.get("ASCEND_GLOBAL_LOG_LEVEL") or "").strip()
    if not raw:
        return 3
    try:
        level = int(raw, 10)
    except ValueError:
        level = None
    if level not in LOG_LEVELS:
        raise ValueError(f"ASCEND_GLOBAL_LOG_LEVEL={raw!r} is not a log level: use 0 debug, "
                         "1 info, 2 warning, 3 error, 4 off (or unset it for 3)")
    return level


JOB_VARS = ("NPUSIM_JOB_ID", "TORCHELASTIC_RESTART_COUNT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Job:
    """Where this process sits in a job, as its launcher (npurun, launcher.spawn, torchrun)
    described it in the environment; every field is None (attempt 0, job_id "local") in a
    process that no launcher started."""

    job_id: str             # NPUSIM_JOB_ID; "local" when unset or not [A-Za-z0-9_.]+
    attempt: int            # TORCHELASTIC_RESTART_COUNT
    rank: int | None        # RANK
    local_rank: int | None  # LOCAL_RANK
    world_size: int | None  # WORLD_SIZE
    master_addr: str | None  # MASTER_ADDR
    master_port: int | None  # MASTER_PORT

    @property
    def launched(self) -> bool:
        """True when a launcher named the job (NPUSIM_JOB_ID set)."""
        return self.job_id != LOCAL_JOB

    @property
    def key_prefix(self) -> str:
        """``npusim/<job>/<attempt>``: the store keys of this attempt of the job."""
        return f"npusim/{self.job_id}/{self.attempt}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Job":
        """The record of ``env``; raises ValueError naming a variable that is set but is not an
        integer >= 0 (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_PORT, TORCHELASTIC_RESTART_COUNT)."""
        def num(name):
            raw = (env.get(name) or "").strip()
            if not raw:
                return None
            if not raw.isdigit():
                raise ValueError(f"{name}={raw!r} is not an integer >= 0 (the launcher sets it)")
            return int(raw)

        raw = (env.get("NPUSIM_JOB_ID") or "").strip()
        job_id = raw if raw and all(c.isalnum() or c in "_." for c in raw) else LOCAL_JOB
        return cls(job_id, num("TORCHELASTIC_RESTART_COUNT") or 0, num("RANK"), num("LOCAL_RANK"),
                   num("WORLD_SIZE"), (env.get("MASTER_ADDR") or "").strip() or None,
                   num("MASTER_PORT"))


LOCAL_JOB = "local"
_job: tuple = ((), None)    # (the raw values it was parsed from, the Job)


def job() -> Job:
    """This process's ``Job``. Parsed once and kept while the variables keep their values (a test
    that sets RANK in-process gets a new record); see ``Job.from_env`` for what it raises."""
    global _job
    raw = tuple(map(os.environ.get, JOB_VARS))
    seen, rec = _job
    if raw != seen or rec is None:
        rec = Job.from_env(os.environ)
        _job = (raw, rec)
    return rec


def local_rank() -> int:
    """LOCAL_RANK: the device ``set_device()`` takes without an argument (0 without a launcher)."""
    lr = job().local_rank
    return 0 if lr is None else lr


def rank() -> int | None:
    """RANK: this process's global rank when a launcher started it (labels logs and traces)."""
    return job().rank


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


def bind() -> bool | None:
    """NPUSIM_BIND: 1 makes npurun bind each rank of a node to one core of those it may use
    (consecutive local ranks share a core, as evenly as the counts allow); 0 or unset (None):
    npurun never binds (see runtime/sched.py: binding loses on a shared machine).
    Raises ValueError for anything but 1/0 (on/off, true/false, yes/no)."""
    return _switch01("NPUSIM_BIND", "npurun leaves its ranks free")


def _switch01(name: str, default: str) -> bool | None:
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{name}={raw!r} must be 1 or 0; unset it for the default ({default})")


def sched_batch() -> bool | None:
    """NPUSIM_SCHED_BATCH: 1 makes npurun start its ranks in Linux's SCHED_BATCH class (a thread
    that wakes another keeps its core until it waits itself), 0 never changes a scheduling
    class; unset (None): as 0 (see runtime/sched.py: SCHED_BATCH loses 8x as soon as another
    program keeps a core busy). With 1, stream workers also move themselves when their wake-ups
    find their work taken.
    Raises ValueError for anything but 1/0 (on/off, true/false, yes/no)."""
    return _switch01("NPUSIM_SCHED_BATCH", "the default class")
