"""Job rendezvous: host the job's store, and make the nodes of a job agree and fail together.

One node: the launcher serves the store on loopback (``--master-port`` or a free port) and needs
nothing else. Several nodes (one npurun each): node 0 serves the store on ``--master-addr``;
every launcher, node 0 included, is a client of it. All keys live under ``npurun/``:

    npurun/job                      node 0: {"job_id", "run_id", "nnodes"}
    npurun/claim/<node>             add() counter: a second launcher with that --node-rank is refused
    npurun/node/<node>              {"host", "nproc", "pid"}: joining = setting it
    npurun/hb/<node>                add() counter bumped every second by each launcher; node 0
                                    watches them and reports a silent node as the attempt's failure
    npurun/attempt/<k>/ready/<node> barrier before restart k
    npurun/attempt/<k>/failed       compare_set: the first failure of attempt k, whichever node
    npurun/attempt/<k>/done/<node>  the node's ranks of attempt k all succeeded
    npurun/bye/<node>               the node has its verdict; node 0 keeps the store up until then

So a failure on any node stops every node (each node polls ``attempt/<k>/failed``), a restart
restarts the whole job, and a launcher that vanishes (no heartbeat for NPUSIM_NODE_TIMEOUT) or a
lost store fails the job instead of leaving its ranks hanging in a collective.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from launcher import config, secret as secrets_
from launcher.procs.env import JobInfo
from launcher.errors import Interrupted, RendezvousError, RendezvousTimeoutError
from launcher.procs.shm import new_job_id

log = logging.getLogger("launcher")

K = "npurun/"
OP_TIMEOUT = 10.0       # one quick store request (set, add, check)
POLL_INTERVAL = 0.5     # how often a node looks for the other nodes' verdicts
HEARTBEAT = 1.0
HEARTBEAT_CHECK = 2.0
BYE_WAIT = 10.0


@dataclass
class Verdict:
    """What the job (all nodes) decided about an attempt."""

    state: str                  # "failed" or "done"
    detail: dict = field(default_factory=dict)   # for "failed": node, rank, exitcode, message


class LocalRendezvous:
    """A one-node job: serve the store on loopback; there are no peers to agree with."""

    def __init__(self, *, master_port: int, nproc_per_node: int, run_id: str | None,
                 max_restarts: int, should_stop: Callable[[], int] = lambda: 0):
        self.master_port, self.nproc = master_port, nproc_per_node
        self.run_id, self.max_restarts = run_id, max_restarts
        self.server = None

    def join(self) -> JobInfo:
        from hccl.store import StoreServer  # noqa: PLC0415 - keeps `import launcher` light
        secret = secrets_.generate()
        job_id = new_job_id()
        self.server = StoreServer("127.0.0.1", self.master_port, secrets_.as_bytes(secret),
                                  name=f"npurun-store-{job_id}").start()
        return JobInfo(job_id=job_id, run_id=self.run_id or job_id, secret=secret,
                       master_addr="127.0.0.1", master_port=self.server.port, nnodes=1,
                       node_rank=0, nproc_per_node=self.nproc, max_restarts=self.max_restarts)

    def begin(self, attempt: int) -> None:
        pass

    def report_failure(self, attempt: int, detail: dict) -> dict:
        return detail

    def report_done(self, attempt: int) -> None:
        pass

    def poll(self, attempt: int) -> Verdict | None:
        return None

    def wait_verdict(self, attempt: int) -> Verdict:
        return Verdict("done")

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _bind_host(master_addr: str) -> str:
    """The address node 0's store binds: --master-addr if it is local, else HCCL_IF_IP / any."""
    try:
        ip = socket.getaddrinfo(master_addr, None)[0][4][0]
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return ip
    except OSError:
        pass
    try:
        from hccl import config as hccl_config  # noqa: PLC0415
        return hccl_config.if_ip() or "0.0.0.0"
    except ImportError:
        return "0.0.0.0"


class NodeRendezvous:
    """One node of a multi-node job (see the module docstring for the protocol)."""

    def __init__(self, *, nnodes: int, node_rank: int, master_addr: str, master_port: int,
                 nproc_per_node: int, run_id: str | None, max_restarts: int, timeout: float,
                 should_stop: Callable[[], int] = lambda: 0, hint: str = ""):
        if not 0 <= node_rank < nnodes:
            raise RendezvousError(f"--node-rank {node_rank} is not in [0, {nnodes - 1}] "
                                  f"(--nnodes {nnodes})")
        self.nnodes, self.node_rank = nnodes, node_rank
        self.master_addr, self.master_port = master_addr, master_port
        self.nproc, self.run_id, self.max_restarts = nproc_per_node, run_id, max_restarts
        self.timeout, self.should_stop, self.hint = timeout, should_stop, hint
        self.server = None
        self.client = None
        self._secret: str | None = None
        self._published = False
        self._joined = False
        self._next_poll = 0.0
        self._beats: dict[int, tuple[int, float]] = {}
        self._next_beat_check = 0.0
        self._store_lost = False
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None

    # -- joining ---------------------------------------------------------------------------
    def _check_stop(self) -> None:
        sig = self.should_stop()
        if sig:
            raise Interrupted(sig)

    def _client(self, secret_hex: str):
        from hccl.store import StoreClient  # noqa: PLC0415
        return StoreClient(self.master_addr, self.master_port, secrets_.as_bytes(secret_hex),
                           timeout=OP_TIMEOUT)

    def _host(self, secret_hex: str, job_id: str) -> None:
        from hccl.store import StoreServer  # noqa: PLC0415
        if config.job_secret() is None:
            secrets_.publish(self.master_port, secret_hex)
            self._published = True
        self.server = StoreServer(_bind_host(self.master_addr), self.master_port,
                                  secrets_.as_bytes(secret_hex),
                                  name=f"npurun-store-{job_id}").start()
        self.client = self._client(secret_hex)
        self.client.set(K + "job", json.dumps(
            {"job_id": job_id, "run_id": self.run_id or job_id, "nnodes": self.nnodes}))

    def _reach(self, secret_hex: str | None, deadline: float) -> dict:
        """Nodes != 0: find node 0's store (and, on loopback, its secret file); return the job."""
        from hccl.store import StoreTimeout  # noqa: PLC0415
        while True:
            self._check_stop()
            if secret_hex is None or self._published_changed(secret_hex):
                fresh = secrets_.wait_published(self.master_port, min(deadline, time.monotonic()
                                                                      + 1.0), self.should_stop)
                if fresh and fresh != secret_hex:
                    secret_hex = fresh
                    if self.client is not None:
                        self.client.close()
                    self.client = None
            if secret_hex is not None:
                if self.client is None:
                    self.client = self._client(secret_hex)
                left = deadline - time.monotonic()
                try:
                    raw = self.client.get(K + "job", timeout=max(0.1, min(1.0, left)))
                    self._secret = secret_hex
                    return json.loads(raw)
                except StoreTimeout:
                    pass
            if time.monotonic() >= deadline:
                raise RendezvousTimeoutError(
                    [0], self.nnodes, self.timeout,
                    hint=(f"no answer from node 0's store at {self.master_addr}:"
                          f"{self.master_port}: is node 0's npurun running there, with the same "
                          f"NPUSIM_JOB_SECRET as this node?" + (f" {self.hint}" if self.hint
                                                                 else "")))

    def _published_changed(self, secret_hex: str) -> bool:
        if config.job_secret() is not None:
            return False
        try:
            return secrets_.read_published(self.master_port) not in (None, secret_hex)
        except Exception:
            return False

    def _wait_keys(self, keys: list[str], deadline: float, abort_key: str | None = None) -> None:
        from hccl.store import StoreTimeout  # noqa: PLC0415
        while True:
            self._check_stop()
            if abort_key is not None and self.client.check([abort_key]):
                detail = json.loads(self.client.get(abort_key))
                raise RendezvousError(f"node {detail.get('node')} gave up while the job "
                                      f"restarted: {detail.get('message')}")
            left = deadline - time.monotonic()
            try:
                self.client.wait(keys, timeout=max(0.05, min(0.5, left)))
                return
            except StoreTimeout as e:
                if time.monotonic() >= deadline:
                    missing = sorted(int(k.rsplit("/", 1)[1]) for k in keys
                                     if not self.client.check([k])) or \
                        sorted(int(k.rsplit("/", 1)[1]) for k in e.missing)
                    raise RendezvousTimeoutError(missing, self.nnodes, self.timeout,
                                                 hint=self.hint) from None

    def join(self) -> JobInfo:
        """Meet the other nodes; returns the job they agreed on. Raises RendezvousError."""
        deadline = time.monotonic() + self.timeout
        secret_hex = secrets_.for_job(self.nnodes, self.node_rank, self.master_addr)
        if self.node_rank == 0:
            self._secret = secret_hex
            self._host(secret_hex, new_job_id())
            job = json.loads(self.client.get(K + "job"))
        else:
            job = self._reach(secret_hex, deadline)
        if int(job["nnodes"]) != self.nnodes:
            raise RendezvousError(f"node 0 runs --nnodes {job['nnodes']}, this node --nnodes "
                                  f"{self.nnodes}: give every node the same value")
        if self.client.add(f"{K}claim/{self.node_rank}", 1) != 1:
            raise RendezvousError(f"another npurun already joined this job as --node-rank "
                                  f"{self.node_rank}: give each node its own rank in "
                                  f"[0, {self.nnodes - 1}]")
        self.client.set(f"{K}node/{self.node_rank}", json.dumps(
            {"host": socket.gethostname(), "nproc": self.nproc, "pid": os.getpid()}))
        self._start_heartbeat()
        self._wait_keys([f"{K}node/{i}" for i in range(self.nnodes)], deadline)
        self._joined = True
        nodes = {i: json.loads(self.client.get(f"{K}node/{i}")) for i in range(self.nnodes)}
        self._hosts = {i: str(n.get("host", "?")) for i, n in nodes.items()}
        odd = {i: n["nproc"] for i, n in nodes.items() if n["nproc"] != self.nproc}
        if odd:
            raise RendezvousError(
                f"--nproc-per-node differs between nodes: this node (node {self.node_rank}) has "
                f"{self.nproc}, " + ", ".join(f"node {i} has {p}" for i, p in sorted(odd.items()))
                + "; RANK = node_rank * nproc_per_node + local_rank needs one value")
        log.info("npurun: node %d joined job %s with %d nodes", self.node_rank, job["job_id"],
                 self.nnodes)
        return JobInfo(job_id=job["job_id"], run_id=job["run_id"], secret=self._secret,
                       master_addr=self.master_addr, master_port=self.master_port,
                       nnodes=self.nnodes, node_rank=self.node_rank,
                       nproc_per_node=self.nproc, max_restarts=self.max_restarts)

    # -- liveness --------------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._hb_stop.wait(HEARTBEAT):
                try:
                    self.client.add(f"{K}hb/{self.node_rank}", 1)
                except Exception:  # the main loop reports a lost store
                    pass
        self.client.add(f"{K}hb/{self.node_rank}", 1)
        self._hb_thread = threading.Thread(target=beat, name="npurun-heartbeat", daemon=True)
        self._hb_thread.start()

    def _lost_node(self) -> Verdict | None:
        """Node 0 only (O(nnodes) requests every HEARTBEAT_CHECK s): a node without heartbeat.

        The other nodes learn of it through ``attempt/<k>/failed``; they only watch the store.
        """
        now, limit = time.monotonic(), config.node_timeout()
        if self.node_rank != 0 or now < self._next_beat_check:
            return None
        self._next_beat_check = now + HEARTBEAT_CHECK
        for i in range(self.nnodes):
            if i == self.node_rank:
                continue
            count = self.client.add(f"{K}hb/{i}", 0)
            seen = self._beats.get(i)
            if seen is None or seen[0] != count:
                self._beats[i] = (count, now)
            elif now - seen[1] > limit:
                lo = i * self.nproc         # the lost node's ranks, named (issue 53)
                ranks = f"rank {lo}" if self.nproc == 1 else f"ranks {lo}-{lo + self.nproc - 1}"
                host = getattr(self, "_hosts", {}).get(i)
                return Verdict("failed", {
                    "node": i, "rank": None, "exitcode": 1, "lost": True,
                    "message": f"node {i}{f' ({host})' if host else ''} is lost, with its "
                               f"{ranks}: its npurun stopped answering (no heartbeat for "
                               f"{limit:g} s, NPUSIM_NODE_TIMEOUT)"})
        return None

    # -- attempts --------------------------------------------------------------------------
    def begin(self, attempt: int) -> None:
        """Barrier: every node is ready to start ``attempt`` (restarts only)."""
        if attempt == 0:
            return
        self.client.set(f"{K}attempt/{attempt}/ready/{self.node_rank}", b"1")
        self._wait_keys([f"{K}attempt/{attempt}/ready/{i}" for i in range(self.nnodes)],
                        time.monotonic() + self.timeout,
                        abort_key=f"{K}attempt/{attempt}/failed")

    def report_failure(self, attempt: int, detail: dict) -> dict:
        """Publish this node's failure; return the job's first failure of ``attempt``."""
        try:
            cur = self.client.compare_set(f"{K}attempt/{attempt}/failed", b"",
                                          json.dumps(detail).encode())
            return json.loads(cur)
        except Exception as e:  # store gone: our own failure is what we know
            log.warning("npurun: cannot tell the other nodes about the failure: %s", e)
            return detail

    def report_done(self, attempt: int) -> None:
        self.client.set(f"{K}attempt/{attempt}/done/{self.node_rank}", b"1")

    def poll(self, attempt: int) -> Verdict | None:
        """Non-blocking (rate-limited): has another node failed, vanished, or the store gone?"""
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + POLL_INTERVAL
        try:
            key = f"{K}attempt/{attempt}/failed"
            if self.client.check([key]):
                return Verdict("failed", json.loads(self.client.get(key)))
            lost = self._lost_node()
            if lost is not None:  # tell every node, then stop like them
                return Verdict("failed", self.report_failure(attempt, lost.detail))
            return None
        except Exception as e:
            self._store_lost = True
            return Verdict("failed", {
                "node": 0, "rank": None, "exitcode": 1,
                "message": f"lost the job's store on node 0 ({self.master_addr}:"
                           f"{self.master_port}): {e}"})

    def wait_verdict(self, attempt: int) -> Verdict:
        """After this node's ranks succeeded: wait until all nodes are done or one failed."""
        from hccl.store import StoreTimeout  # noqa: PLC0415
        keys = [f"{K}attempt/{attempt}/done/{i}" for i in range(self.nnodes)]
        while True:
            self._check_stop()
            self._next_poll = 0.0
            verdict = self.poll(attempt)
            if verdict is not None:
                return verdict
            try:
                self.client.wait(keys, timeout=POLL_INTERVAL)
                return Verdict("done")
            except StoreTimeout:
                pass
            except Exception as e:
                self._store_lost = True
                return Verdict("failed", {"node": 0, "rank": None, "exitcode": 1,
                                          "message": f"lost the job's store: {e}"})

    def close(self) -> None:
        """Leave the job; node 0 keeps serving until every node has its verdict (<= 10 s)."""
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=2)
        if self.client is not None and self._joined and not self._store_lost:
            try:
                self.client.set(f"{K}bye/{self.node_rank}", b"1")
                if self.node_rank == 0 and self._joined:
                    keys = [f"{K}bye/{i}" for i in range(self.nnodes)]
                    deadline = time.monotonic() + BYE_WAIT
                    while time.monotonic() < deadline and not self.client.check(keys):
                        if self._lost_node() is not None:  # it will never say bye
                            break
                        try:
                            self.client.wait(keys, timeout=0.5)
                        except Exception:
                            pass
            except Exception:
                pass
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._published and self._secret:
            secrets_.unpublish(self.master_port, self._secret)
