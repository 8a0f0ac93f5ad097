"""Every environment knob of hccl, in one typed table (runtime.config's machinery).

A communicator reads the knobs of its collectives (HCCL_ALGO, the slice size,
HCCL_EXEC_TIMEOUT) once, at its first use of them, and keeps them.

Names and units follow HCCL. A bad value raises ``InvalidArgumentError`` naming the variable, the
value and what is expected (runtime.config's one message shape), instead of being silently
replaced by the default; npurun refuses the same values with the same text before it starts a
rank (launcher.config.check).
"""
from __future__ import annotations

from hccl.errors import InvalidArgumentError
from runtime import config as runtime_config
from runtime.config import EnvError, Job, Table, Var
from runtime.log import LEVELS

MiB = 1 << 20


WIRE_SLICE_DEFAULT = 8 * MiB


def _slot_bytes(value: int) -> str:
    return "" if value % 64 == 0 else "a multiple of 64 bytes"


TABLE = Table("hccl", [
    Var("HCCL_CONNECT_TIMEOUT", "seconds", 120.0, "seconds for communicator init and link setup, "
        "and for the nodes of a job to find each other", "hccl.init, launcher.cli"),
    Var("HCCL_EXEC_TIMEOUT", "seconds", 1800.0, "seconds of the longest wait for a peer inside a "
        "collective", "hccl.comm, launcher.diagnose (shown in a stall notice)"),
    Var("HCCL_BUFFSIZE", "int", 200, "MB, slice size for pipelining (npusim cuts wire messages "
        "at NPUSIM_WIRE_SLICE_BYTES)", "hccl.comm (slice_bytes)", lo=1),
    Var("NPUSIM_WIRE_SLICE_BYTES", "int", WIRE_SLICE_DEFAULT, "largest message put on the wire",
        "hccl.comm (slice_bytes)", shown="8 MiB", lo=1),
    Var("NPUSIM_SLICE_BYTES", "int", None, "bytes: overrides HCCL_BUFFSIZE and the wire slice "
        "(tests exercise slicing with small buffers)", "hccl.comm (slice_bytes)", lo=1),
    Var("HCCL_INTRA_ROCE_ENABLE", "switch", False, "1: ranks of one node use the network path "
        "(sockets), as between nodes", "hccl.init (shm)"),
    Var("NPUSIM_SHM", "switch", True, "1: ranks of one node talk through shared-memory rings and "
        "read large slices from each other's device memory (docs/transport.md); 0: sockets only",
        "hccl.init"),
    Var("NPUSIM_SHM_MIN_BYTES", "int", 512 << 10, "smallest payload read in place from the peer's "
        "device memory", "hccl.transport.process", shown="512 KiB", lo=1),
    Var("NPUSIM_SHM_SLOTS", "int", 32, "slots of each intra-node ring (a full ring: the sender waits up to 1 ms, then the socket)",
        "hccl.transport.process", lo=1),
    Var("NPUSIM_SHM_SLOT_BYTES", "int", (64 << 10) + 128, "bytes of one ring slot, header "
        "included (a multiple of 64)", "hccl.transport.process", shown="64 KiB + 128", lo=128,
        check=_slot_bytes),
    Var("NPUSIM_SHM_SPIN_US", "number", None, "microseconds a waiter spins before it sleeps",
        "hccl.transport.process", shown="200; 50 when ranks outnumber cores up to 3 to 1; 0 above", lo=0, hi=1e6),
    Var("HCCL_ALGO", "text", None, "unset: chosen by size and world (allreduce: from 3 ranks star "
        "through rank 0 up to 4 MiB then mesh, at 2 one-shot then ring; allgather from 3 ranks "
        "star up to 64 KiB gathered then mesh; tree broadcast, docs/algorithms.md); `ring`, "
        "`hd`, `oneshot`, `star`, `tree`, `scatter`, `mesh` (`fullmesh`), or HCCL's "
        "`level0:NA;level1:ring`, force one", "hccl.comm", shown="by size and world"),
    Var("HCCL_IF_IP", "ip", None, "address to bind and advertise", "hccl.init, launcher.rendezvous",
        shown="loopback unless the job spans nodes"),
    Var("NPUSIM_LIVENESS_INTERVAL", "seconds", 0.5, "seconds between two checks, during a wait, "
        "that the awaited peer still lives", "hccl.transport.base"),
    Var("NPUSIM_HEARTBEAT_TIMEOUT", "seconds", 10.0, "seconds without heartbeats before a peer on "
        "another node is gone", "hccl.transport.zmq"),
    Var("NPUSIM_TRACE_BUFFER", "int", 2000, "flight-recorder records per rank", "hccl.flight"),
    Var("NPUSIM_JOB_SECRET", "hex", None, "the job's secret (hex, set by npurun; a multi-node job "
        "takes it from npurun's environment): every message of the job is signed with it",
        "hccl.init, hccl.torch_rendezvous, launcher.secret, launcher.rendezvous",
        shown="npurun makes one per job", secret=True),
    Var("NPUSIM_DIAG", "switch", False, "1 (set by npurun): publish this rank's state to the "
        "job's store", "hccl.diag"),
    Var("NPUSIM_DIAG_INTERVAL", "seconds", 0.5, "seconds between two publications of the rank's "
        "state", "hccl.diag"),
    Var("NPUSIM_FLIGHT_FILE", "path", None, "where a failing collective dumps the flight recorder "
        "(set by npurun)", "hccl.diag"),
    Var("GROUP_RANK", "int", None, "this node's index in the job (set by npurun)", "hccl.diag"),
])

# the variables a launcher sets for init_comm (RANK ... MASTER_PORT are runtime's, the secret ours)
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NPUSIM_JOB_SECRET")


def get(name: str):
    """The parsed value of ``name`` (hccl's table, else runtime's); InvalidArgumentError with the
    table's message when its value is refused."""
    table = TABLE if name in TABLE else runtime_config.TABLE
    try:
        return table.get(name)
    except EnvError as e:
        raise InvalidArgumentError(str(e)) from None


def launcher_vars() -> dict[str, str]:
    """The launcher's variables that are set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    NPUSIM_JOB_SECRET), as text, each checked by its table's rule first (InvalidArgumentError
    naming a refused one)."""
    out = {}
    for name in LAUNCHER_VARS:
        if get(name) is not None:
            out[name] = runtime_config.raw(name)
    return out


def local_rank(default: int) -> int:
    """LOCAL_RANK, or ``default`` when no launcher set it (mp.spawn sets none)."""
    lr = job().local_rank
    return default if lr is None else lr


def rank_text() -> str | None:
    """RANK as the launcher set it (checked), None outside a launcher: labels a flight dump."""
    rank = job().rank
    return None if rank is None else str(rank)


def connect_timeout() -> float:
    """HCCL_CONNECT_TIMEOUT: seconds for communicator init and link setup (default 120)."""
    return get("HCCL_CONNECT_TIMEOUT")


def exec_timeout() -> float:
    """HCCL_EXEC_TIMEOUT: seconds of the longest wait for a peer in a collective (default 1800)."""
    return get("HCCL_EXEC_TIMEOUT")


def liveness_interval() -> float:
    """NPUSIM_LIVENESS_INTERVAL: seconds between two checks, by a rank waiting for a peer, that the
    peer is still alive (default 0.5). A dead peer is reported within about this plus 2 s."""
    return get("NPUSIM_LIVENESS_INTERVAL")


def heartbeat_timeout() -> float:
    """NPUSIM_HEARTBEAT_TIMEOUT: seconds without any answer from a peer of another node after
    which its connection is declared broken (default 10; ZeroMQ heartbeats every fifth of it)."""
    return get("NPUSIM_HEARTBEAT_TIMEOUT")


def buffsize_mb() -> int:
    """HCCL_BUFFSIZE: staging/pipelining buffer size in MB (default 200, at least 1)."""
    return get("HCCL_BUFFSIZE")


def wire_slice_bytes() -> int:
    """NPUSIM_WIRE_SLICE_BYTES: largest message put on the wire (default 8 MiB, npusim only).

    ZeroMQ over loopback moves 2+ GB/s with messages of a few MiB but about 1 GB/s with 32-64 MiB
    ones (every such message is a fresh mmap'd allocation on the receiver: glibc never reuses
    blocks above 32 MiB), so a chunk is sliced at this size even when HCCL_BUFFSIZE is larger.
    """
    return get("NPUSIM_WIRE_SLICE_BYTES")


def slice_bytes() -> int:
    """Largest piece of a chunk sent as one message: HCCL_BUFFSIZE MB, at most
    ``wire_slice_bytes()``.

    ``NPUSIM_SLICE_BYTES`` (bytes, npusim only) overrides both, so tests can exercise slicing and
    pipelining with small buffers.
    """
    override = get("NPUSIM_SLICE_BYTES")
    return override if override else min(buffsize_mb() * MiB, wire_slice_bytes())


def intra_roce() -> bool:
    """HCCL_INTRA_ROCE_ENABLE: 1 sends between the ranks of one node over the network path
    (sockets), as between nodes; 0 (default) uses shared memory inside a node."""
    return get("HCCL_INTRA_ROCE_ENABLE")


def shm() -> bool:
    """NPUSIM_SHM: 1 (default) lets ranks of one node talk through shared memory (rings for
    messages, in-place reads of each other's device memory); 0 sends everything over the
    sockets, as does HCCL_INTRA_ROCE_ENABLE=1."""
    return not intra_roce() and get("NPUSIM_SHM")


def shm_min_bytes() -> int:
    """NPUSIM_SHM_MIN_BYTES: the smallest payload sent through shared memory (default 512 KiB;
    below it a copy through the socket costs less than the notice and its acknowledgement)."""
    return get("NPUSIM_SHM_MIN_BYTES")


def shm_slots() -> int:
    """NPUSIM_SHM_SLOTS: slots of each intra-node ring (default 32); a sender that finds the
    ring full sends over the socket instead of waiting."""
    return get("NPUSIM_SHM_SLOTS")


def shm_slot_bytes() -> int:
    """NPUSIM_SHM_SLOT_BYTES: bytes of one ring slot, header included (default 64 KiB + 128, a
    multiple of 64): payloads up to it minus 96 bytes are copied through the ring, larger ones in
    device memory are read in place by the receiver."""
    return get("NPUSIM_SHM_SLOT_BYTES")


def shm_spin_us() -> float | None:
    """NPUSIM_SHM_SPIN_US: microseconds a waiter spins before it sleeps (None: the default, 200
    when the node's ranks fit the cores this process may use, 50 when they outnumber them up
    to 3 to 1, 0 above: hccl.transport.process)."""
    return get("NPUSIM_SHM_SPIN_US")


def job() -> Job:
    """The job this process belongs to (``runtime.config.Job``: job id, attempt, rank, world
    size, ...), read from the environment in one place; a set variable that is not an integer
    raises InvalidArgumentError naming it."""
    try:
        return runtime_config.job()
    except EnvError as e:
        raise InvalidArgumentError(str(e)) from None


def job_secret() -> bytes | None:
    """NPUSIM_JOB_SECRET (set by npurun, hex): the key every message of the job is signed with;
    None when unset (not an npusim job)."""
    return get("NPUSIM_JOB_SECRET")


def algo_set() -> bool:
    """True when HCCL_ALGO is set (then it is obeyed for every size; unset, small AllReduces
    use the one-shot schedule)."""
    return get("HCCL_ALGO") is not None


def algo() -> str:
    """HCCL_ALGO: algorithm name (default "ring").

    Accepts a plain name (``ring``) or HCCL's per-level form (``level0:NA;level1:ring``), in which
    case the highest level that names an algorithm wins. The name is checked against the
    schedule registry by ``hccl.algo.schedule.algorithms``.
    """
    raw = get("HCCL_ALGO")
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
    return get("HCCL_IF_IP")


def log_level() -> int:
    """ASCEND_GLOBAL_LOG_LEVEL: 0 debug, 1 info, 2 warning, 3 error (default), 4 off (runtime's
    table; a bad value raises InvalidArgumentError)."""
    return get("ASCEND_GLOBAL_LOG_LEVEL")


def logging_level() -> int:
    """``log_level()`` as a ``logging`` module level."""
    return LEVELS[log_level()]


def trace_buffer() -> int:
    """NPUSIM_TRACE_BUFFER: collective records kept by the flight recorder (default 2000)."""
    return get("NPUSIM_TRACE_BUFFER")


# -- the job npusim's launcher (or launcher.spawn) started this process in ------------------------
def diag_enabled() -> bool:
    """NPUSIM_DIAG=1 (set by npurun): publish this rank's state to the job store."""
    return get("NPUSIM_DIAG")


def diag_interval() -> float:
    """NPUSIM_DIAG_INTERVAL: seconds between two publications of the rank's state (default 0.5)."""
    return get("NPUSIM_DIAG_INTERVAL")


def flight_file() -> str | None:
    """NPUSIM_FLIGHT_FILE: where a failing collective dumps the flight recorder (npurun sets it)."""
    return get("NPUSIM_FLIGHT_FILE")


def job_rank() -> int:
    """RANK: this process's rank in the job (0 outside a launcher)."""
    rank = job().rank
    return 0 if rank is None else rank


def node_rank() -> str | None:
    """GROUP_RANK: this node's index in the job (None outside a launcher), as text."""
    node = get("GROUP_RANK")
    return None if node is None else str(node)
