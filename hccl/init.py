"""Creating world communicators: root info (HcclGetRootInfo / HcclCommInitRootInfo) and init_comm.

Root info is opaque bytes (``NPUSIMRI1`` + JSON, never pickle) naming the store that the root
hosts and a unique id; it also carries the job secret when the process has none in its
environment (``NPUSIM_JOB_SECRET``), so keep it as private as the secret itself. Every rank
binds its transport, publishes its entry (address, node, process identity, shared-memory
segment) under ``<uid>/addr/<rank>`` and waits at most HCCL_CONNECT_TIMEOUT for all the others;
a rank that never arrives fails init on every rank with a message listing the ranks that
arrived and the ranks that did not.

Scale. Rank 0 gathers the N entries with one request (``multi_get``, parked in the store until
all are set) and publishes them as one table; every other rank waits for that one key. Then the
connect barrier (every rank has recorded the table: docs/transport.md). So init costs 4
requests per rank and O(N^2) work in the store thread, and opens no connection to a peer: the
transport connects to a peer at its first message (``hccl.transport.process``).
"""
from __future__ import annotations

import atexit
import ipaddress
import json
import os
import secrets
import socket
import sys
import threading

from . import config, diag
from .comm import Comm, World, comm_id_of
from .errors import HcclError, HcclTimeoutError, InvalidArgumentError
from .store import StoreClient, StoreServer, StoreTimeout
from .transport import liveness, shm
from .transport.inproc import InprocFabric
from .transport.process import ProcessTransport
from .types import Result

_MAGIC = b"NPUSIMRI1"
_servers: list = []
_lock = threading.Lock()
_init_calls = 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _bind_host(store_host: str) -> str:
    """HCCL_IF_IP, else loopback for a loopback store, else the address that routes to the store."""
    ip = config.if_ip()
    if ip:
        return ip
    if _is_loopback(store_host):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(store_host), 9))   # no packet is sent for UDP connect
        return s.getsockname()[0]


def get_root_info() -> bytes:
    """On the root rank: host a rendezvous store and return the root info to give every rank."""
    secret = config.job_secret()
    embed = secret is None
    if embed:
        secret = secrets.token_bytes(32)
    host = config.if_ip() or "127.0.0.1"
    server = StoreServer(host, 0, secret, name="hccl-root-store").start()
    with _lock:
        _servers.append(server)
    info = {"host": host, "port": server.port, "uid": secrets.token_hex(12)}
    if embed:
        info["secret"] = secret.hex()
    return _MAGIC + json.dumps(info, sort_keys=True).encode()


def _parse_root_info(root_info) -> dict:
    if not isinstance(root_info, (bytes, bytearray)) or not bytes(root_info).startswith(_MAGIC):
        raise InvalidArgumentError("comm_init_root_info: root_info is not the bytes returned by "
                                   "hccl.get_root_info() on the root rank")
    try:
        info = json.loads(bytes(root_info)[len(_MAGIC):].decode())
        host, port, uid = str(info["host"]), int(info["port"]), str(info["uid"])
    except (ValueError, KeyError, TypeError):
        raise InvalidArgumentError("comm_init_root_info: root_info is corrupted") from None
    secret = bytes.fromhex(info["secret"]) if "secret" in info else config.job_secret()
    if secret is None:
        raise InvalidArgumentError("comm_init_root_info: root_info carries no secret and "
                                   "NPUSIM_JOB_SECRET is not set in this process")
    return {"host": host, "port": port, "uid": uid, "secret": secret}


def comm_init_root_info(nranks: int, root_info: bytes, rank: int) -> Comm:
    """HcclCommInitRootInfo: join the world communicator of ``nranks`` ranks as ``rank``."""
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise InvalidArgumentError(f"comm_init_root_info: nranks={nranks!r} must be a positive int")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nranks:
        raise InvalidArgumentError(f"comm_init_root_info: rank={rank!r} must be in [0, {nranks})")
    info = _parse_root_info(root_info)
    return _rendezvous(info["host"], info["port"], info["secret"], info["uid"], rank, nranks)


def init_comm() -> Comm:
    """The world communicator of a job started by npurun / launcher.spawn (from its environment:
    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NPUSIM_JOB_SECRET). Each call makes a new one;
    every rank must make the same calls in the same order.

    With none of those variables set (a script run with plain ``python``) it makes a world of
    one, rank 0 of 1, and says so in one line on stderr, as MPI's singleton init does; a partial
    set is an error naming what is missing."""
    global _init_calls
    env = config.launcher_vars()   # the set ones, each checked by its table's rule
    launcher_keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NPUSIM_JOB_SECRET")
    missing = [k for k in launcher_keys if not env.get(k)]
    if len(missing) == len(launcher_keys):
        return _singleton()
    if missing:
        raise InvalidArgumentError(
            f"init_comm: {', '.join(missing)} not set; start the job with npurun (or launcher.spawn), "
            "or use get_root_info / comm_init_root_info")
    try:
        rank, size, port = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["MASTER_PORT"])
    except ValueError:
        raise InvalidArgumentError("init_comm: RANK, WORLD_SIZE and MASTER_PORT must be integers") from None
    with _lock:
        _init_calls += 1
        n = _init_calls
    job = config.job()
    uid = f"hccl/{job.job_id}/{job.attempt}/world{n}"
    return _rendezvous(env["MASTER_ADDR"], port, config.job_secret(), uid, rank, size)


def _singleton() -> Comm:
    """A world of one over the in-process transport: no store, no sockets, no shared memory."""
    global _init_calls
    with _lock:
        _init_calls += 1
        uid = f"hccl/singleton/{os.getpid()}/world{_init_calls}"
    print("npusim: no launcher environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): "
          "hccl.init_comm() makes a world of one (rank 0 of 1); start with npurun for more ranks",
          file=sys.stderr, flush=True)
    world = World(InprocFabric(1).transport(0), uid=uid)
    return Comm(world, [0], comm_id_of(uid), "world")


def _rendezvous(host: str, port: int, secret: bytes, uid: str, rank: int, size: int) -> Comm:
    timeout = config.connect_timeout()
    store = StoreClient(host, port, secret, timeout=timeout)
    transport = None
    try:
        transport = _transport(rank, size, secret, _bind_host(host))
        # address, node id, process identity (pid:start time) and segment: the peers of this
        # node watch the process, so a dead rank is named without the launcher's help
        store.set(f"{uid}/addr/{rank}", "\n".join(
            (transport.address, transport.node, liveness.identity(), transport.segment)).encode())
        table = _table(store, uid, rank, size, timeout)
        found = {r: _peer_entry(table[r], r) for r in range(size) if r != rank}
        transport.watch_processes({r: e[2] for r, e in found.items()})
        nodes = {r: e[1] for r, e in found.items()}
        addresses = {r: e[0] for r, e in found.items()}
        segments = {r: found[r][3] for r, n in nodes.items()
                    if n == transport.node} if transport.channel is not None else {}
        transport.connect(addresses, nodes, segments)
        # The ordering that makes every first message usable: a rank returns its communicator
        # (and may send) only after every rank has connected, i.e. knows which peers share its
        # node. Without this barrier a fast rank's first SHM_DATA could reach a peer that had
        # not yet learnt the sender is local (docs/transport.md, "Start-up ordering").
        store.set(f"{uid}/connected/{rank}", b"1")
        _wait_all(store, [f"{uid}/connected/{r}" for r in range(size)], timeout, rank,
                  "never finished connecting")
        transport.unlink_segment()          # peers map it through /proc: no name outlives init
    except BaseException:
        if transport is not None:
            transport.close()
        store.close()
        raise
    world = World(transport, uid=uid, store=store)
    comm = Comm(world, list(range(size)), comm_id_of(uid), "world")
    diag.attach(world, store)
    return comm


def _table(store: StoreClient, uid: str, rank: int, size: int, timeout: float) -> list[bytes]:
    """Every rank's entry, read from the store once per job, not once per rank: rank 0 gets the
    size keys with one request (the store holds it until all are set) and publishes them as one
    value that the other ranks get with one request each (size + 1 requests in all, where each
    rank reading every key was size^2: 65k at world 256, one store thread serving them while
    every rank waits)."""
    keys = [f"{uid}/addr/{r}" for r in range(size)]
    key = f"{uid}/table"
    if rank == 0:
        try:
            entries = store.multi_get(keys, timeout=timeout)
        except StoreTimeout as e:
            raise _never_arrived(keys, e.missing, timeout, rank, "never arrived") from None
        store.set(key, json.dumps([e.decode("utf-8", "replace") for e in entries]).encode())
        return entries
    try:
        raw = store.get(key, timeout=timeout)
    except StoreTimeout:
        try:                    # who is missing: a look at the keys, without waiting
            store.wait(keys, timeout=0)
        except StoreTimeout as e:
            raise _never_arrived(keys, e.missing, timeout, rank, "never arrived") from None
        raw = None
    if raw is None:             # all arrived, the last just now: rank 0 gathers and publishes
        try:
            raw = store.get(key, timeout=min(timeout, 5.0))
        except StoreTimeout:
            raw = None
    if raw is None:
        raise HcclTimeoutError(
            f"[rank {rank}] communicator init timed out after {timeout:g} s "
            f"(HCCL_CONNECT_TIMEOUT={timeout:g}): every rank arrived but rank 0 never published "
            "the table of their addresses; check rank 0's output.", seq=0, waited=timeout,
            timeout=timeout, rank=rank) from None
    rows = json.loads(raw)
    if not isinstance(rows, list) or len(rows) != size:
        raise HcclError(f"communicator init: rank 0 published a table of "
                        f"{len(rows) if isinstance(rows, list) else '?'} ranks for a world of "
                        f"{size}; are all ranks running the same npusim version?")
    return [str(e).encode() for e in rows]


def _peer_entry(raw: bytes, peer: int) -> tuple[str, str, str, str]:
    """(address, node id, process identity, segment) that rank ``peer`` published at init."""
    parts = raw.decode("utf-8", "replace").split("\n")
    if len(parts) != 4:
        raise HcclError(f"communicator init: rank {peer} published {len(parts)} fields "
                        "(address, node, process, segment) instead of 4; are all ranks running "
                        "the same npusim version?")
    return parts[0], parts[1], parts[2], parts[3]


def _transport(rank: int, size: int, secret: bytes, bind_host: str) -> ProcessTransport:
    """The node's shared-memory rings plus sockets, or sockets only (NPUSIM_SHM=0,
    HCCL_INTRA_ROCE_ENABLE=1, or not x86-64 Linux: ``shm.available``)."""
    return ProcessTransport(rank, size, secret, bind_host=bind_host,
                            shm=config.shm() and shm.available(), job=config.job().job_id)


def _wait_all(store: StoreClient, keys: list[str], timeout: float, rank: int, what: str) -> None:
    """Wait until every rank has set its key (the rank is the key's last component)."""
    try:
        store.wait(keys, timeout=timeout)
    except StoreTimeout as e:
        raise _never_arrived(keys, e.missing, timeout, rank, what) from None


def _never_arrived(keys: list[str], missing: list[str], timeout: float, rank: int,
                   what: str) -> HcclTimeoutError:
    """The init timeout naming the ranks whose keys are ``missing``."""
    lost = set(missing)
    gone = sorted(int(k.rsplit("/", 1)[1]) for k in lost)
    came = [int(k.rsplit("/", 1)[1]) for k in keys if k not in lost]
    return HcclTimeoutError(
        f"[rank {rank}] communicator init timed out after {timeout:g} s "
        f"(HCCL_CONNECT_TIMEOUT={timeout:g}): ranks {gone} {what}; arrived: {came}. "
        "Check that every rank started and calls init with the same world size, or raise "
        "HCCL_CONNECT_TIMEOUT.", seq=0, waited=timeout, timeout=timeout, rank=rank)


def _close_servers():
    for s in _servers:
        try:
            s.close()
        except Exception:
            pass


atexit.register(_close_servers)


__all__ = ["get_root_info", "comm_init_root_info", "init_comm", "HcclError", "Result"]
