"""Every environment knob of the runtime, in one typed table; and the table machinery that
hccl/config.py and launcher/config.py use for theirs.

Design. Each package owns one ``Table`` of ``Var`` entries: name, type, default, meaning and the
modules that read it; docs/environment.md is generated from the three tables
(``python -m benchmarks.envdoc --write``). Every value is parsed by its type's one rule
(``RULES``) when first read, and the parsed value is kept while the raw text stays the same (a test
that sets a variable in-process gets the new value). A value that its rule refuses raises
``EnvError`` (a ValueError) with one message shape everywhere: ``NAME='raw' is not <what the type
expects>; unset it for the default (<default>)``; hccl re-raises it as InvalidArgumentError and
npurun as ConfigError, with the same text. No module of runtime, hccl or launcher reads
``os.environ`` except these config modules (tests/unit/test_env_table.py scans for it).
"""
from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

GiB = 1 << 30


class EnvError(ValueError):
    """An environment variable set to a value its type's rule refuses."""


# -- one rule per type: raw text (stripped, never empty) -> value, or ValueError(what it expects) --
def _integer(raw: str, var: "Var") -> int:
    lo, hi = var.lo if var.lo is not None else 0, var.hi
    try:
        value = int(raw, 10)
    except ValueError:
        value = None
    if value is None or value < lo or (hi is not None and value > hi):
        raise ValueError(f"an integer in [{lo}, {hi}]" if hi is not None else
                         f"an integer >= {lo}")
    return value


def _seconds(raw: str, var: "Var") -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    lo, hi = var.lo, var.hi
    if not (math.isfinite(value) and (value > 0 if lo is None else value >= lo)
            and (hi is None or value < hi)):
        raise ValueError(f"a number in [{lo:g}, {hi:g})" if hi is not None else
                         "a positive number of seconds" if lo is None else
                         f"a number of seconds >= {lo:g}")
    return value


_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def _switch(raw: str, var: "Var") -> bool:
    low = raw.lower()
    if low in _ON:
        return True
    if low in _OFF:
        return False
    raise ValueError("1 or 0 (on/off, true/false, yes/no)")


def _choice(raw: str, var: "Var") -> str:
    low = raw.lower()
    for value, spellings in var.choices:
        if low in spellings:
            return value
    raise ValueError("one of " + ", ".join(s for _, ss in var.choices for s in ss))


def _text(raw: str, var: "Var") -> str:
    return raw


def _hex(raw: str, var: "Var") -> bytes:
    try:
        return bytes.fromhex(raw)
    except ValueError:
        raise ValueError("hexadecimal (npurun sets it)") from None


def _ip(raw: str, var: "Var") -> str:
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise ValueError("an IP address, e.g. 10.0.0.5") from None


def _job_id(raw: str, var: "Var") -> str:
    # a job id names shared-memory segments and store keys: anything else is the local default
    return raw if all(c.isalnum() or c in "_." for c in raw) else var.default


RULES: dict[str, Callable[[str, "Var"], object]] = {
    "int": _integer, "seconds": _seconds, "number": _seconds, "switch": _switch,
    "choice": _choice, "text": _text, "path": _text, "hex": _hex, "ip": _ip, "job id": _job_id}


@dataclass(frozen=True)
class Var:
    """One environment variable: its type (a key of RULES), default (the value when unset or
    empty), meaning, and the modules that read it. ``shown`` is the default as the docs show it
    (when the value alone would not say it); ``lo``/``hi`` bound numbers; ``choices`` is
    ``((value, (spellings...)), ...)`` for a choice; ``check`` refuses a parsed value (returns
    what it expects, or "")."""

    name: str
    type: str
    default: object
    meaning: str
    readers: str
    shown: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    check: Callable[[object], str] | None = field(default=None, compare=False)
    secret: bool = False    # never echo the value in a message

    def parse(self, raw: str | None):
        """The value of raw text ``raw`` (None or blank: the default); EnvError if refused."""
        if raw is None or raw.strip() == "":
            return self.default
        text = raw.strip()
        try:
            value = RULES[self.type](text, self)
            problem = self.check(value) if self.check else ""
        except ValueError as e:
            problem = str(e)
        if problem:
            shown = f"{self.name} (value not shown)" if self.secret else f"{self.name}={text!r}"
            raise EnvError(f"{shown} is not {problem}; unset it for the default "
                           f"({self.default_text()})")
        return value

    def default_text(self) -> str:
        if self.shown:
            return self.shown
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


class Table:
    """The variables of one package; ``get(name)`` parses each raw value once."""

    def __init__(self, package: str, variables: list[Var]):
        self.package = package
        self.vars = {v.name: v for v in variables}
        self._parsed: dict[str, tuple[str | None, object]] = {}

    def __iter__(self):
        return iter(self.vars.values())

    def __contains__(self, name: str) -> bool:
        return name in self.vars

    def get(self, name: str, env: Mapping[str, str] | None = None):
        """The parsed value of ``name`` in ``env`` (default: this process's environment)."""
        var = self.vars[name]
        raw = (os.environ if env is None else env).get(name)
        if env is not None:
            return var.parse(raw)
        seen = self._parsed.get(name)
        if seen is not None and seen[0] == raw:
            return seen[1]
        value = var.parse(raw)
        self._parsed[name] = (raw, value)
        return value

    def check(self, env: Mapping[str, str] | None = None) -> None:
        """Parse every variable of the table; raise EnvError for the first refused one."""
        for name in self.vars:
            self.get(name, env)


def raw(name: str) -> str | None:
    """The raw text of ``name`` (stripped; None when unset or blank), for a config module that
    hands a variable on as it is (PET_<FLAG>, the launcher's environment copy)."""
    value = os.environ.get(name)
    return value.strip() if value is not None and value.strip() else None


def environment() -> dict[str, str]:
    """A copy of this process's whole environment: what a launcher hands on to its children (a
    copy, never a knob read: knobs are read through the tables)."""
    return dict(os.environ)


LOG_LEVELS = (0, 1, 2, 3, 4)     # ASCEND_GLOBAL_LOG_LEVEL: debug, info, warning, error, off
LOCAL_JOB = "local"

TABLE = Table("runtime", [
    Var("NPUSIM_DEVICE_COUNT", "int", 8, "simulated NPUs per node",
        "runtime.context, runtime.acl, launcher.env", lo=1),
    Var("NPUSIM_HBM_BYTES", "int", 16 * GiB, "capacity of each NPU in bytes (a limit, not "
        "pre-allocated RAM)", "runtime.context", shown="16 GiB", lo=1),
    Var("NPUSIM_CARD_DIR", "path", None, "where the ledgers of this machine's simulated cards "
        "live (runtime/memory/card.py): processes with the same directory and node share each "
        "device's HBM; a test suite points it at a directory of its own",
        "runtime.memory.card, launcher.smi",
        shown="/dev/shm/npusim.cards.<uid>"),
    Var("NPUSIM_CARD_SHARE", "switch", True, "1: the processes of a node that use one device "
        "share its HBM (one card, runtime/memory/card.py); 0: each process has a card of its own",
        "runtime.memory.card"),
    Var("NPUSIM_PROFILE_DIR", "path", None, "write a Chrome trace per rank into this directory "
        "(npurun merges them)", "runtime.profiler, launcher.cli"),
    Var("ASCEND_GLOBAL_LOG_LEVEL", "int", 3, "0 debug, 1 info, 2 warning, 3 error, 4 off",
        "runtime.log, hccl.config, launcher.cli", lo=0, hi=4),
    Var("NPUSIM_STREAM_CHECK", "choice", "off", "the stream sanitizer (runtime/sanitizer.py): 1 "
        "raises StreamRaceError on a race, warn reports it and goes on, 0 off",
        "runtime (at import)", shown="0", choices=(
            ("off", ("0", "off", "false", "no")), ("raise", ("1", "on", "raise", "true", "yes")),
            ("warn", ("warn",)))),
    Var("ASCEND_MEM_CHECK", "choice", "off", "CANN's switch to detect unsynchronized device "
        "memory accesses between streams: here the stream sanitizer, as NPUSIM_STREAM_CHECK "
        "(same values), which wins when both are set", "runtime (at import)", shown="0",
        choices=(("off", ("0", "off", "false", "no")),
                 ("raise", ("1", "on", "raise", "true", "yes")), ("warn", ("warn",)))),
    Var("NPUSIM_BIND", "switch", None, "1: npurun binds each rank to one core (consecutive local "
        "ranks share one) and says so on its first line; 0: never; unset: npurun's watcher binds "
        "crowded ranks one core per pair while no other program uses the cores, to the cores "
        "the others leave free while one does (NPUSIM_SCHED_WATCH)",
        "runtime.sched, launcher.schedwatch (npurun's launch policy)",
        shown="unset: the watcher"),
    Var("NPUSIM_SCHED_BATCH", "switch", None, "1: npurun starts its ranks in Linux's SCHED_BATCH "
        "class (the ranks' threads inherit it; the library never changes a user's thread) and a "
        "stream worker whose wake-ups find its work taken moves itself; 0: no class is ever "
        "changed; unset: npurun's watcher runs crowded ranks in SCHED_BATCH only while no other "
        "program uses the cores (SCHED_BATCH loses 8x beside a busy program: "
        "launcher/schedwatch.py)",
        "runtime.sched, launcher.schedwatch (npurun's launch policy, stream workers)",
        shown="unset: the watcher"),
    Var("NPUSIM_JOB_ID", "job id", LOCAL_JOB, "the job's id (set by npurun): names its store keys "
        "and shared-memory segments; not [A-Za-z0-9_.]+: the default", "runtime.config.job"),
    Var("TORCHELASTIC_RESTART_COUNT", "int", 0, "the attempt of a restarted job (set by npurun)",
        "runtime.config.job"),
    Var("RANK", "int", None, "this process's global rank (set by the launcher)",
        "runtime.config.job, runtime.log, runtime.profiler, hccl.init, hccl.diag, "
        "hccl.flight, launcher.worker"),
    Var("LOCAL_RANK", "int", None, "rank on this node: the device set_device() takes without an "
        "argument (0 without a launcher)", "runtime.config.job, runtime.context, hccl.torch_backend, launcher.worker"),
    Var("WORLD_SIZE", "int", None, "ranks in the job (set by the launcher)",
        "runtime.config.job, hccl.init", lo=1),
    Var("MASTER_ADDR", "text", None, "host of the job's store (set by the launcher)",
        "runtime.config.job, hccl.init"),
    Var("MASTER_PORT", "int", None, "port of the job's store (set by the launcher)",
        "runtime.config.job, hccl.init", lo=1, hi=65535),
    Var("NPUSIM_NODE", "text", None, "the node npurun started this rank on, '<job id>/<node "
        "rank>' (set by npurun): shared memory and pid liveness only within it",
        "runtime.memory.ipc", check=lambda v: "" if (len(v) <= 200 and v.isprintable()
                                                     and not any(c.isspace() for c in v)) else
        f"a node name ({len(v)} characters): npurun sets it to '<job id>/<node rank>' "
        "(printable, no whitespace, at most 200 characters); unset it outside npurun"),
    Var("NPUSIM_NODE_CORES", "int", None, "cores the ranks of this node share (set by npurun: "
        "the cores it may use; a rank it binds to one core still sees them all); unset: the "
        "process's own affinity", "runtime.sched.node_cores (hccl.transport.process: a "
        "waiter's spin)", lo=1),
])

JOB_VARS = ("NPUSIM_JOB_ID", "TORCHELASTIC_RESTART_COUNT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")


def node() -> str | None:
    """NPUSIM_NODE: the node npurun started this process on, or None without npurun."""
    return TABLE.get("NPUSIM_NODE")


def node_cores() -> int | None:
    """NPUSIM_NODE_CORES: the cores this node's ranks share (set by npurun), or None."""
    return TABLE.get("NPUSIM_NODE_CORES")


def device_count() -> int:
    """NPUSIM_DEVICE_COUNT: number of simulated NPUs on this node (default 8)."""
    return TABLE.get("NPUSIM_DEVICE_COUNT")


def hbm_bytes() -> int:
    """NPUSIM_HBM_BYTES: capacity of each simulated NPU (default 16 GiB)."""
    return TABLE.get("NPUSIM_HBM_BYTES")


def card_dir() -> str | None:
    """NPUSIM_CARD_DIR: where the card ledgers live (None: runtime.memory.card's default)."""
    return TABLE.get("NPUSIM_CARD_DIR")


def card_share() -> bool:
    """NPUSIM_CARD_SHARE: True (default) makes the processes of a node share each device."""
    return TABLE.get("NPUSIM_CARD_SHARE")


def profile_dir() -> str | None:
    """NPUSIM_PROFILE_DIR: write a Chrome trace of every task into this directory."""
    return TABLE.get("NPUSIM_PROFILE_DIR")


def log_level() -> int:
    """ASCEND_GLOBAL_LOG_LEVEL: 0 debug, 1 info, 2 warning, 3 error (default), 4 off. The one
    parser of it: hccl.config and launcher.config call this. Raises EnvError naming the value."""
    return TABLE.get("ASCEND_GLOBAL_LOG_LEVEL")


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
        """The record of ``env``; raises EnvError (a ValueError) naming a variable whose value
        the table refuses (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_PORT, TORCHELASTIC_RESTART_COUNT
        must be integers >= 0, WORLD_SIZE >= 1, MASTER_PORT a port)."""
        return cls(*(TABLE.get(name, env) for name in JOB_VARS))


_job: tuple = ((), None)    # (the raw values it was parsed from, the Job)


def job() -> Job:
    """This process's ``Job``. Parsed once and kept while the variables keep their values (a test
    that sets RANK in-process gets a new record); see ``Job.from_env`` for what it raises."""
    global _job
    raw_values = tuple(map(os.environ.get, JOB_VARS))
    seen, rec = _job
    if raw_values != seen or rec is None:
        rec = Job.from_env(os.environ)
        _job = (raw_values, rec)
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
    raise: a race raises StreamRaceError), "warn" (reports and goes on) or "off" (unset, 0, off).
    Unset, CANN's ASCEND_MEM_CHECK (the same values) decides; both refuse a value named."""
    mode = TABLE.get("NPUSIM_STREAM_CHECK")
    cann = TABLE.get("ASCEND_MEM_CHECK")
    return cann if raw("NPUSIM_STREAM_CHECK") is None else mode


def bind() -> bool | None:
    """NPUSIM_BIND: True makes npurun bind each rank of a node to one core of those it may use
    (consecutive local ranks share a core); False: npurun never binds; unset (None): npurun's
    watcher binds crowded ranks while no other program uses the cores (launcher/schedwatch.py).
    EnvError for anything but 1/0 (on/off, true/false, yes/no)."""
    return TABLE.get("NPUSIM_BIND")


def sched_batch() -> bool | None:
    """NPUSIM_SCHED_BATCH: True makes npurun start its ranks in Linux's SCHED_BATCH class (and
    stream workers move themselves when their wake-ups find their work taken); False: no
    scheduling class is changed; unset (None): npurun's watcher runs crowded ranks in
    SCHED_BATCH while no other program uses the cores (launcher/schedwatch.py: SCHED_BATCH
    loses 8x as soon as another program keeps a core busy). EnvError for anything but 1/0."""
    return TABLE.get("NPUSIM_SCHED_BATCH")
