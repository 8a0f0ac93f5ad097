"""Every environment knob of the launcher, read in one place.

SLURM's variables are inputs, not knobs: ``launcher.slurm`` reads them from the mapping it is given.
"""
from __future__ import annotations

import os
import sys

from runtime import config as runtime_config


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must be >= 0")
    return value


def stop_grace() -> float:
    """NPUSIM_STOP_GRACE: seconds between SIGTERM and SIGKILL when stopping workers (default 5)."""
    return _float("NPUSIM_STOP_GRACE", 5.0)


def connect_timeout() -> float:
    """HCCL_CONNECT_TIMEOUT: seconds for the nodes of a job to find each other (default 120).

    Read through ``hccl.config`` when it provides it, so both packages agree on one value.
    """
    try:
        from hccl import config as hccl_config  # noqa: PLC0415 - optional, hccl may be absent
        fn = getattr(hccl_config, "connect_timeout", None)
        if callable(fn):
            return float(fn())
    except ImportError:
        pass
    return _float("HCCL_CONNECT_TIMEOUT", 120.0)


def node_timeout() -> float:
    """NPUSIM_NODE_TIMEOUT: seconds without a heartbeat after which a node's launcher is taken
    for dead (multi-node jobs; default 30)."""
    return _float("NPUSIM_NODE_TIMEOUT", 30.0)


def job_secret() -> str | None:
    """NPUSIM_JOB_SECRET in the launcher's own environment: the job's shared secret (hex)."""
    value = os.environ.get("NPUSIM_JOB_SECRET", "").strip()
    return value or None


def runtime_dir() -> str | None:
    """XDG_RUNTIME_DIR: the per-user directory for the loopback multi-node secret file."""
    return os.environ.get("XDG_RUNTIME_DIR") or None


def python_exec() -> str:
    """PYTHON_EXEC (as torchrun): the interpreter that runs the workers (default: this one)."""
    return os.environ.get("PYTHON_EXEC") or sys.executable


def log_level() -> int:
    """ASCEND_GLOBAL_LOG_LEVEL (parsed by ``runtime.config.log_level``: 0 debug .. 3 error,
    4 off); a bad value leaves the launcher at 3, as it leaves the ranks' loggers."""
    try:
        return runtime_config.log_level()
    except ValueError:
        return 3


def flag_default(dest: str, default):
    """torchrun's PET_<FLAG> variables (e.g. PET_NPROC_PER_NODE) give a flag's default."""
    raw = os.environ.get("PET_" + dest.upper())
    return default if raw is None or raw == "" else raw


def user_device_count() -> str | None:
    """NPUSIM_DEVICE_COUNT as the user set it (the runtime owns its meaning)."""
    return os.environ.get("NPUSIM_DEVICE_COUNT") or None


def hang_notice() -> float:
    """NPUSIM_HANG_NOTICE: seconds ranks may wait for another without progress before npurun
    names the rank they wait for, with its Python stack, without stopping the job (default 15,
    so the culprit of a stall is named within 20 s; 0 turns the notice off)."""
    return _float("NPUSIM_HANG_NOTICE", 15.0)


def exec_timeout_text() -> str:
    """HCCL_EXEC_TIMEOUT as the ranks see it (they inherit npurun's environment), for a notice:
    until then a stalled job goes on."""
    return os.environ.get("HCCL_EXEC_TIMEOUT") or "1800 (HCCL's default)"


def hang_remind() -> float:
    """NPUSIM_HANG_REMIND: seconds between two reminders of the same stall (default 300)."""
    return _float("NPUSIM_HANG_REMIND", 300.0)


def deadlock_stable() -> float:
    """NPUSIM_DEADLOCK_STABLE: seconds a wait-for cycle must stay the same before npurun calls it
    a deadlock and stops the job (default 3)."""
    return _float("NPUSIM_DEADLOCK_STABLE", 3.0)


def fork_server() -> bool:
    """NPUSIM_FORKSERVER: 1 (default) starts the ranks of a node from one prepared process that
    imported numpy, pyzmq, runtime and hccl once (``launcher.forkserver``); 0 starts each rank
    in a fresh interpreter, as before. Raises ValueError for anything but 1/0."""
    raw = os.environ.get("NPUSIM_FORKSERVER", "").strip().lower()
    if raw in ("", "1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"NPUSIM_FORKSERVER={raw!r} must be 1 or 0; unset it for the default (1: "
                     "the ranks are forked from one prepared process)")


def fork_server_preload() -> list[str]:
    """NPUSIM_FORKSERVER_PRELOAD: more modules for the fork server to import before it forks the
    ranks (comma-separated, e.g. ``torch``), read by the server itself."""
    return [m.strip() for m in os.environ.get("NPUSIM_FORKSERVER_PRELOAD", "").split(",")
            if m.strip()]
