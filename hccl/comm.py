"""Communicators: ranks of a world, per-communicator sequence numbers and remembered calls.

Design note. A *world* is one transport connecting the processes (or, in tests, threads) of a
job. Every communicator of that world shares its transport and tags its messages with its own
64-bit ``comm_id``, so concurrent communicators never cross. A collective (``hccl.collectives``,
whose ``Collectives`` are this class's methods) is checked once and becomes a ``hccl.call.Call``
that the communicator remembers (``Calls``); each issue takes the next ``seq`` of the
communicator when its task is made (host order, as HCCL requires every rank to call the same
collectives in the same order) and enqueues one task on the caller's stream, which runs the
call's program through the executor. Point-to-point operations count their own per-peer
sequence on a separate id, so they are never taken for a mismatch with a collective.

When a collective fails on one rank (timeout, mismatch), that rank aborts the communicator
(``executor.failure``): every peer waiting in it fails at once with RemoteRankError naming the
rank (or, for a mismatch, with the same CollectiveMismatchError) instead of waiting for its own
timeout. An aborted communicator stays aborted: create a new one.
"""
from __future__ import annotations

import hashlib
import os
import threading

import numpy as np

from runtime.callsite import add_internal
from runtime.log import setup as setup_log

from . import config
from .call import P2P_BIT as _P2P_BIT, Calls
from .collectives import Collectives
from .errors import HcclError, HcclTimeoutError, InvalidArgumentError, RemoteRankError
from .transport.base import Aborted, PeerTimeout
from .types import Result

log = setup_log("hccl")
# collective failures surface from stream synchronize with their own type (and as TaskError)
HcclError.npusim_surface = True
add_internal(os.path.dirname(os.path.abspath(__file__)))


def comm_id_of(text: str) -> int:
    """A 62-bit communicator id from a unique string."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & (_P2P_BIT - 1)


class World:
    """One transport and what keeps it alive (store client, hosted store server)."""

    def __init__(self, transport, *, uid: str, store=None, server=None):
        self.transport, self.uid, self.store, self.server = transport, uid, store, server
        self.rank, self.size = transport.rank, transport.size
        self.comms = 0
        self.comm_ids: set[int] = set()        # every comm id in use (dead-peer abort)
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            self.comms -= 1
            if self.comms > 0:
                return
        for obj in (self.transport, self.store, self.server):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # closing must never raise
                    log.debug("close failed", exc_info=True)


class Comm(Collectives):
    """A communicator: ``rank`` and ``size`` within it, a name, and its collectives.

    Create one with ``comm_init_root_info``, ``init_comm`` or ``create_sub_comm``.
    """

    def __init__(self, world: World, ranks: list[int], comm_id: int, name: str):
        self.world = world
        self.ranks = list(ranks)            # comm rank -> world rank
        self.rank = self.ranks.index(world.rank)
        self.size = len(self.ranks)
        self.comm_id = comm_id
        self.name = name
        self.exec_timeout: float | None = None
        self._knobs: tuple | None = None    # (algorithm, slice bytes, solo bytes): _read_knobs
        self._env_timeout: float | None = None  # HCCL_EXEC_TIMEOUT, read at the first use
        self._seq = 0
        self._p2p: dict[tuple[str, int], int] = {}
        self._subs: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._destroyed = False
        self._calls = Calls()               # the validated calls an eager call may repeat
        with world._lock:
            world.comms += 1
            world.comm_ids.update((comm_id, comm_id | _P2P_BIT))

    # ------------------------------------------------------------------ lifecycle
    def __repr__(self):
        return f"<hccl.Comm {self.name} rank {self.rank}/{self.size}{' destroyed' if self._destroyed else ''}>"

    def set_exec_timeout(self, seconds: float) -> None:
        """Override HCCL_EXEC_TIMEOUT for this communicator (the longest wait for a peer)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise InvalidArgumentError(f"set_exec_timeout(seconds={seconds!r}): must be a positive number")
        self.exec_timeout = float(seconds)

    def set_slice_bytes(self, nbytes: int) -> None:
        """Slice this communicator's later collectives at ``nbytes`` (at most
        NPUSIM_WIRE_SLICE_BYTES) instead of HCCL_BUFFSIZE's size: torch's per-group
        ``hccl_buffer_size``. The algorithm (HCCL_ALGO) and the transport's solo bytes are read
        now and kept with it, as a first collective keeps them (``hccl.collectives``)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise InvalidArgumentError(f"set_slice_bytes(nbytes={nbytes!r}): must be an int >= 1")
        algo = config.algo() if config.algo_set() else "auto"
        self._knobs = (algo, min(nbytes, config.wire_slice_bytes()),
                       self.world.transport.solo_bytes)

    def find_call(self, key, objs: tuple):
        """The Call remembered under ``key`` (``collectives.all_reduce_keyed``) if it still
        holds for the buffers ``objs`` (``hccl.call.Calls.find``), else None: its ``issue``
        repeats it without the checks."""
        return self._calls.find(key, objs)

    def timeout(self) -> tuple[float, bool]:
        """The longest wait for a peer, and whether ``set_exec_timeout`` set it (every call asks;
        the text naming the source is built by ``executor.failure`` only)."""
        if self.exec_timeout is not None:
            return self.exec_timeout, True
        if self._env_timeout is None:
            self._env_timeout = config.exec_timeout()
        return self._env_timeout, False

    def destroy(self) -> None:
        """Release the communicator (HcclCommDestroy); later calls on it raise E_PARA."""
        if self._destroyed:
            return
        self._destroyed = True
        self._calls.clear()
        try:
            self.world.transport.forget(self.comm_id)
            self.world.transport.forget(self.comm_id | _P2P_BIT)
        except Exception:
            pass
        with self.world._lock:
            self.world.comm_ids.difference_update((self.comm_id, self.comm_id | _P2P_BIT))
        self.world.release()

    def take_seqs(self, n: int = 1) -> int:
        """Take the next ``n`` collective sequence numbers; returns the first (an issue of a
        collective takes one, a fused group of a task graph one per call: hccl.algo.fusion)."""
        with self._lock:
            first = self._seq + 1
            self._seq += n
        return first

    def _check_alive(self, what: str) -> None:
        if self._destroyed:
            raise InvalidArgumentError(f"{what}: communicator {self.name} was destroyed; create a new one",
                                       Result.E_PARA)

    def create_sub_comm(self, rank_ids) -> "Comm":
        """A communicator of the ranks ``rank_ids`` of this one (HCCL's habit: called by each of
        them, in the same order on every member; non-members do not call it). The caller's rank
        in the new comm is its index in ``rank_ids``. See ``new_group`` for torch's habit."""
        ids = self._sub_ids(rank_ids, "create_sub_comm")
        if self.rank not in ids:
            raise InvalidArgumentError(
                f"create_sub_comm(rank_ids={ids}): rank {self.rank} is not a member; only members "
                "call it (or let every rank call comm.new_group(ranks), which returns None on "
                "non-members, as torch's new_group does)")
        return self._sub(ids)

    def new_group(self, ranks) -> "Comm | None":
        """torch's habit: EVERY rank of this communicator calls it, in the same order; members
        get the communicator of ``ranks`` (ordered by rank, as torch orders a group), the other
        ranks get None. Ranks in the new comm are local: its ``rank`` is the index there."""
        ids = sorted(self._sub_ids(ranks, "new_group"))
        return self._sub(ids) if self.rank in ids else None

    def _sub_ids(self, rank_ids, api: str) -> list[int]:
        """``rank_ids`` checked: ints, in range, no duplicates, not empty."""
        self._check_alive(api)
        if isinstance(rank_ids, (str, bytes)) or not hasattr(rank_ids, "__iter__"):
            raise InvalidArgumentError(f"{api}(rank_ids={rank_ids!r}): expected a list of ints")
        rank_ids = list(rank_ids)
        bad = [r for r in rank_ids if isinstance(r, bool) or not isinstance(r, (int, np.integer))]
        if bad:
            # int() would silently turn 1.5 into 1 and True into 1: a different communicator
            raise InvalidArgumentError(f"{api}(rank_ids={rank_ids!r}): {bad[0]!r} is not an int rank")
        ids = [int(r) for r in rank_ids]
        if not ids:
            raise InvalidArgumentError(f"{api}(rank_ids=[]): a communicator needs at least one rank")
        dup = sorted({r for r in ids if ids.count(r) > 1})
        if dup:
            raise InvalidArgumentError(f"{api}(rank_ids={ids}): rank(s) {dup} listed more than once")
        out = [r for r in ids if not 0 <= r < self.size]
        if out:
            raise InvalidArgumentError(
                f"{api}(rank_ids={ids}): rank(s) {out} out of range for a communicator of "
                f"{self.size} ranks (valid: 0..{self.size - 1})")
        return ids

    def _sub(self, ids: list[int]) -> "Comm":
        key = tuple(ids)
        with self._lock:
            n = self._subs.get(key, 0)
            self._subs[key] = n + 1
        cid = comm_id_of(f"{self.comm_id}/sub/{key}/{n}")
        return Comm(self.world, [self.ranks[r] for r in ids], cid,
                    f"{self.name}.sub{list(ids)}" + (f"#{n}" if n else ""))

    def wait_any_sender(self, timeout: float | None = None) -> int:
        """The rank whose next point-to-point message to this rank arrived first (receive from
        any source: then ``recv`` from it). Waits up to ``timeout`` s (default: the exec
        timeout); raises ``HcclTimeoutError`` when nothing came, ``RemoteRankError`` if the
        communicator was aborted."""
        self._check_alive("wait_any_sender")
        with self._lock:
            want = {self.ranks[p]: self._p2p.get(("recv", p), 0) + 1
                    for p in range(self.size) if p != self.rank}
        if not want:
            raise InvalidArgumentError(f"wait_any_sender: communicator {self.name} has no other rank")
        timeout = self.timeout()[0] if timeout is None else timeout
        try:
            peer = self.world.transport.first_arrived(self.comm_id | _P2P_BIT, want, timeout)
        except PeerTimeout as e:
            raise HcclTimeoutError(f"[rank {self.rank}] recv from any source on {self.name}: "
                                   f"nothing arrived within {timeout:g} s", peer=-1, seq=0,
                                   waited=e.waited, timeout=timeout, rank=self.rank) from None
        except Aborted as e:
            raise RemoteRankError(f"[rank {self.rank}] recv from any source on {self.name}: the "
                                  f"communicator was aborted: {e}", world_peer=e.peer,
                                  reason=str(e), seq=0) from None
        return self.ranks.index(peer)
