"""Every environment knob of the launcher, in one typed table (runtime.config's machinery).

npurun also reads knobs of runtime and hccl (the log level, HCCL_CONNECT_TIMEOUT, the exec timeout
it shows in a notice, the job secret): those are their tables' entries, parsed by the same rules.
``check()`` parses every knob npurun's ranks inherit from it before a rank starts, so a value the
ranks would refuse is refused by npurun with the same text (as ConfigError). SLURM's variables are
inputs, not knobs: ``launcher.slurm`` reads them from the mapping it is given (``environment()``).

Light on purpose: launcher.worker, the rank's bootstrap, imports this module before the user's
code, and importing runtime (numpy, ml_dtypes) there would delay every rank's stack dump and
death guard by seconds on a loaded machine. So the tables (runtime's machinery) are built on first
use, and the worker's own variables, which npurun sets for it (NPUSIM_STACK_FILE,
TORCHELASTIC_ERROR_FILE, NPUSIM_LAUNCHER_PID, RANK, LOCAL_RANK), are read with their rule inline:
paths as text, pids and ranks as decimal integers (anything else: unset).
"""
from __future__ import annotations

import os
import sys

from launcher.errors import ConfigError

_ROWS = [
    # (name, type, default, meaning, readers, extra)
    ("NPUSIM_STOP_GRACE", "seconds", 5.0, "seconds between SIGTERM and SIGKILL when npurun "
     "stops its workers", "launcher.agent, launcher.spawning", {"lo": 0}),
    ("NPUSIM_NODE_TIMEOUT", "seconds", 30.0, "seconds without a heartbeat after which a node's "
     "npurun is taken for dead (multi-node jobs)", "launcher.rendezvous", {"lo": 0}),
    ("NPUSIM_HANG_NOTICE", "seconds", 15.0, "seconds the ranks of a collective may wait for one "
     "that does not come before npurun names it, with its state and stack, as a notice (0 off)",
     "launcher.agent.diagnose", {"lo": 0}),
    ("NPUSIM_HANG_REMIND", "seconds", 300.0, "seconds between two reminders of the same stall",
     "launcher.agent.diagnose", {"lo": 0}),
    ("NPUSIM_DEADLOCK_STABLE", "seconds", 3.0, "seconds a wait-for cycle must stay the same "
     "before npurun calls it a deadlock", "launcher.agent.diagnose", {"lo": 0}),
    ("NPUSIM_FORKSERVER", "switch", True, "1: npurun starts the ranks of a node by forking one "
     "prepared process that imported numpy, pyzmq, runtime and hccl once; 0: each rank is a "
     "fresh interpreter", "launcher.agent.start", {}),
    ("NPUSIM_SCHED_WATCH", "switch", True, "1: with more ranks than cores, npurun runs its "
     "ranks in SCHED_BATCH, one core per rank pair, while no other program uses the cores, and "
     "in the default class on the cores the others leave free as soon as one does (a watcher "
     "thread; said on its first line); 0: npurun changes nothing NPUSIM_SCHED_BATCH / NPUSIM_BIND do not ask for",
     "launcher.agent.schedwatch", {}),
    ("NPUSIM_SCHED_WATCH_CORES", "number", 0.3, "the other programs' CPU use, in cores, above "
     "which npurun's watcher takes the ranks out of SCHED_BATCH to the cores the others leave "
     "free (back after 0.6 s below half of it)", "launcher.agent.schedwatch",
     {"lo": 0, "hi": 4096}),
    ("NPUSIM_FORKSERVER_PRELOAD", "text", None, "more modules the fork server imports before it "
     "forks the ranks (comma-separated, e.g. torch)", "launcher.procs.forkserver", {}),
    ("XDG_RUNTIME_DIR", "path", None, "the per-user directory for the loopback multi-node "
     "secret file", "launcher.secret", {}),
    ("PYTHON_EXEC", "path", None, "the interpreter that runs the workers (as torchrun)",
     "launcher.procs.env", {"shown": "this one"}),
    ("PET_<FLAG>", "text", None, "torchrun's defaults of npurun's flags (e.g. "
     "PET_NPROC_PER_NODE)", "launcher.cli", {}),
    ("NPUSIM_LAUNCHER_PID", "int", None, "npurun's pid (set by npurun): a rank whose launcher "
     "died before it armed its parent-death signal exits", "launcher.worker", {}),
    ("TORCHELASTIC_ERROR_FILE", "path", None, "where a failing rank writes its error record "
     "(set by npurun, as torchrun)", "launcher.worker", {}),
    ("NPUSIM_STACK_FILE", "path", None, "where a rank dumps its Python stacks on SIGUSR1 (set "
     "by npurun)", "launcher.worker", {}),
]
_table = None


def table():
    """The launcher's Table (built on first use: it needs runtime.config's machinery)."""
    global _table
    if _table is None:
        from runtime.config import Table, Var  # noqa: PLC0415 - see the module docstring
        _table = Table("launcher", [Var(n, t, d, m, r, **x) for n, t, d, m, r, x in _ROWS])
    return _table


def __getattr__(name: str):
    if name == "TABLE":
        return table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tables():
    from hccl import config as hccl_config  # noqa: PLC0415 - see the module docstring
    from runtime import config as runtime_config  # noqa: PLC0415
    return table(), hccl_config.TABLE, runtime_config.TABLE


def _raw(name: str) -> str | None:
    """The variable's text, stripped; None when unset or blank (the text rule)."""
    value = os.environ.get(name)
    return value.strip() if value is not None and value.strip() else None


def worker_int(name: str) -> int | None:
    """A variable npurun sets for its worker, as a decimal integer (anything else: None)."""
    value = _raw(name)
    return int(value) if value is not None and value.isdigit() else None


def get(name: str):
    """The parsed value of ``name`` (the launcher's table, else hccl's, else runtime's);
    ConfigError with the table's message when its value is refused."""
    from runtime.config import EnvError  # noqa: PLC0415 - see the module docstring
    tab = next(t for t in _tables() if name in t)
    try:
        return tab.get(name)
    except EnvError as e:
        raise ConfigError(str(e)) from None


# set by npurun for each worker, whatever its own environment holds: not the user's knobs
SET_FOR_WORKERS = ("NPUSIM_JOB_ID", "TORCHELASTIC_RESTART_COUNT", "RANK", "LOCAL_RANK",
                   "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "GROUP_RANK", "NPUSIM_DIAG", "NPUSIM_FLIGHT_FILE", "NPUSIM_LAUNCHER_PID",
    "TORCHELASTIC_ERROR_FILE", "NPUSIM_STACK_FILE")


def check() -> None:
    """Parse every knob of the three tables that npurun's workers inherit from it (npurun's start):
    ConfigError for a refused value, with the text the ranks would raise it with."""
    for tab in _tables():
        for var in tab:
            if not var.name.endswith(">") and var.name not in SET_FOR_WORKERS:
                get(var.name)


def environment() -> dict[str, str]:
    """The launcher's whole environment, copied: what it hands on to its workers, and SLURM's
    inputs (never a knob read: knobs go through ``get``)."""
    return dict(os.environ)


def stop_grace() -> float:
    """NPUSIM_STOP_GRACE: seconds between SIGTERM and SIGKILL when stopping workers (default 5)."""
    return get("NPUSIM_STOP_GRACE")


def connect_timeout() -> float:
    """HCCL_CONNECT_TIMEOUT (hccl's table): seconds for the nodes of a job to find each other
    (default 120)."""
    return get("HCCL_CONNECT_TIMEOUT")


def node_timeout() -> float:
    """NPUSIM_NODE_TIMEOUT: seconds without a heartbeat after which a node's launcher is taken
    for dead (multi-node jobs; default 30)."""
    return get("NPUSIM_NODE_TIMEOUT")


def job_secret() -> str | None:
    """NPUSIM_JOB_SECRET in the launcher's own environment: the job's shared secret, as hex text
    (hccl's rule checks it is hex; launcher.secret checks its length)."""
    return get("NPUSIM_JOB_SECRET") and _raw("NPUSIM_JOB_SECRET")


def runtime_dir() -> str | None:
    """XDG_RUNTIME_DIR: the per-user directory for the loopback multi-node secret file."""
    return get("XDG_RUNTIME_DIR")


def python_exec() -> str:
    """PYTHON_EXEC (as torchrun): the interpreter that runs the workers (default: this one)."""
    return get("PYTHON_EXEC") or sys.executable


def log_level() -> int:
    """ASCEND_GLOBAL_LOG_LEVEL (runtime's table: 0 debug .. 3 error, 4 off); a bad value raises
    ConfigError, as the ranks' hccl raises InvalidArgumentError, with the same text."""
    return get("ASCEND_GLOBAL_LOG_LEVEL")


def flag_default(dest: str, default):
    """torchrun's PET_<FLAG> variables (e.g. PET_NPROC_PER_NODE) give a flag's default (the flag's
    own parser checks the text)."""
    raw = _raw("PET_" + dest.upper())
    return default if raw is None else raw


def user_device_count() -> str | None:
    """NPUSIM_DEVICE_COUNT as the user set it (runtime's rule checks it), None when unset."""
    get("NPUSIM_DEVICE_COUNT")     # refused here if the ranks would refuse it
    return _raw("NPUSIM_DEVICE_COUNT")


def profile_dir() -> str | None:
    """NPUSIM_PROFILE_DIR (runtime's table): where the ranks write their traces, merged by npurun."""
    return get("NPUSIM_PROFILE_DIR")


def sched_watch() -> bool:
    """NPUSIM_SCHED_WATCH: whether npurun adapts its crowded ranks' class and cores to the other
    programs' CPU use (launcher/agent/schedwatch.py; default on)."""
    return get("NPUSIM_SCHED_WATCH")


def sched_watch_cores() -> float:
    """NPUSIM_SCHED_WATCH_CORES: the other programs' CPU use, in cores, above which npurun's
    watcher leaves SCHED_BATCH and the ranks' cores (default 0.3)."""
    return get("NPUSIM_SCHED_WATCH_CORES")


def hang_notice() -> float:
    """NPUSIM_HANG_NOTICE: seconds ranks may wait for another without progress before npurun
    names the rank they wait for, with its Python stack, without stopping the job (default 15,
    so the culprit of a stall is named within 20 s; 0 turns the notice off)."""
    return get("NPUSIM_HANG_NOTICE")


def exec_timeout_text() -> str:
    """HCCL_EXEC_TIMEOUT as the ranks see it (parsed by hccl's rule), for a notice: until then a
    stalled job goes on."""
    if _raw("HCCL_EXEC_TIMEOUT") is None:
        return f"{_tables()[1].vars['HCCL_EXEC_TIMEOUT'].default:g} (HCCL's default)"
    return f"{get('HCCL_EXEC_TIMEOUT'):g}"


def hang_remind() -> float:
    """NPUSIM_HANG_REMIND: seconds between two reminders of the same stall (default 300)."""
    return get("NPUSIM_HANG_REMIND")


def deadlock_stable() -> float:
    """NPUSIM_DEADLOCK_STABLE: seconds a wait-for cycle must stay the same before npurun calls it
    a deadlock and stops the job (default 3)."""
    return get("NPUSIM_DEADLOCK_STABLE")


def launcher_pid() -> int | None:
    """NPUSIM_LAUNCHER_PID (set by npurun): the launcher a rank checks it still has."""
    return worker_int("NPUSIM_LAUNCHER_PID")


def error_file() -> str | None:
    """TORCHELASTIC_ERROR_FILE (set by npurun): where this rank writes its error record."""
    return _raw("TORCHELASTIC_ERROR_FILE")


def stack_file() -> str | None:
    """NPUSIM_STACK_FILE (set by npurun): where this rank dumps its stacks on SIGUSR1."""
    return _raw("NPUSIM_STACK_FILE")


def rank() -> int | None:
    """RANK as npurun set it for this worker (decimal; None outside a launcher)."""
    return worker_int("RANK")


def local_rank() -> int | None:
    """LOCAL_RANK as npurun set it for this worker (decimal; None outside a launcher)."""
    return worker_int("LOCAL_RANK")


def replace_environment(env: dict[str, str]) -> None:
    """Make ``env`` this process's whole environment (a forked rank takes the one npurun made for
    it); the tables cache parsed values by their raw text, so they see the new values."""
    os.environ.clear()
    os.environ.update(env)


def fork_server() -> bool:
    """NPUSIM_FORKSERVER: True (default) starts the ranks of a node from one prepared process that
    imported numpy, pyzmq, runtime and hccl once (``procs.forkserver``); False starts each rank
    in a fresh interpreter. ConfigError for anything but 1/0."""
    return get("NPUSIM_FORKSERVER")


def fork_server_preload() -> list[str]:
    """NPUSIM_FORKSERVER_PRELOAD: more modules for the fork server to import before it forks the
    ranks (comma-separated, e.g. ``torch``), read by the server itself."""
    return [m.strip() for m in (get("NPUSIM_FORKSERVER_PRELOAD") or "").split(",") if m.strip()]
