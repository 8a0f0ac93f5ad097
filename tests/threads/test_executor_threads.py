"""The executor with ranks as threads over the in-process transport, against numpy.

Every collective x every dtype x every reduce op x sizes {1,2,3,4,5,8} x counts
{0, 1, 7, 1000, not divisible by size, bytes above the 4 KiB slice size}, in place and out of
place. One fabric per world size; each test runs a whole batch of cases in one set of threads,
one seq per case, so threads start once per (size, collective).
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from hccl import executor, schedule
from hccl.transport import inproc
from hccl.errors import (CollectiveMismatchError, HcclTimeoutError, InvalidArgumentError,
                         RemoteRankError)
from hccl.reduction import reduce_reference
from hccl.transport.base import Pair
from hccl.types import DataType, Fingerprint, OpType, ReduceOp


SIZES = [1, 2, 3, 4, 5, 8]
SLICE = 4096
TIMEOUT = 30.0
REDUCING = [OpType.ALLREDUCE, OpType.REDUCE_SCATTER, OpType.REDUCE]
OTHERS = [OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL, OpType.SEND]
PER_RANK_COUNT = (OpType.ALLGATHER, OpType.REDUCE_SCATTER, OpType.ALLTOALL)

_fabrics: dict[int, object] = {}
_comm_ids = iter(range(1, 1 << 30))


@pytest.fixture(scope="module", autouse=True)
def _close_fabrics():
    yield
    for f in _fabrics.values():
        f.close()
    _fabrics.clear()


def fabric(size: int):
    f = _fabrics.get(size)
    if f is None:
        f = _fabrics[size] = inproc.InprocFabric(size)
    return f


@dataclass(frozen=True)
class Case:
    op: OpType
    dtype: DataType
    redop: ReduceOp | None
    count: int
    inplace: bool
    root: int


def counts(op: OpType, dt: DataType, size: int) -> list[int]:
    """0, 1, 7, 1000, one not divisible by size, and one whose chunks exceed the slice size."""
    per_chunk = -(-3 * SLICE // (2 * dt.itemsize))          # 1.5 slices a chunk
    big = per_chunk if op in PER_RANK_COUNT else per_chunk * size
    return [0, 1, 7, 1000, 3 * size + 1, big]


def cases_for(op: OpType, size: int) -> list[Case]:
    out = []
    redops = list(ReduceOp) if op in REDUCING else [None]
    inplaces = [False] if op in (OpType.BROADCAST, OpType.SEND) else [False, True]
    for dt in DataType:
        for redop in redops:
            for count in counts(op, dt, size):
                for inplace in inplaces:
                    out.append(Case(op, dt, redop, count, inplace, len(out) % size))
    return out


def inputs(case: Case, index: int, size: int, rank: int) -> np.ndarray:
    """Rank's input for case ``index`` (deterministic)."""
    rng = np.random.default_rng([index, rank, int(case.op)])
    n = case.count * (size if case.op in (OpType.REDUCE_SCATTER, OpType.ALLTOALL) else 1)
    dt = case.dtype.numpy
    if case.dtype.is_float:
        # |x| in [0.5, 2): products of 8 stay normal even in fp16; sums of 8 stay below 16
        x = rng.uniform(0.5, 2.0, n)
        np.negative(x, out=x, where=rng.random(n) < 0.5)
        return x.astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


class CaseData:
    """Inputs of all ranks and the reference result of one case, computed once for all threads."""

    def __init__(self, case: Case, index: int, size: int):
        self.xs = [inputs(case, index, size, j) for j in range(size)]
        self.total = reduce_reference(self.xs, case.redop) if case.op in REDUCING else None
        self.tol = tolerance(case, self.xs, size) if case.op in REDUCING else 0.0


class SharedCases:
    """Per-case data built by the first rank thread that needs it, dropped after the last."""

    def __init__(self, cases: list[Case], size: int):
        self.cases, self.size = cases, size
        self._lock = threading.Lock()
        self._data: dict[int, list] = {}

    def get(self, index: int) -> CaseData:
        with self._lock:
            entry = self._data.get(index)
            if entry is None:
                entry = self._data[index] = [CaseData(self.cases[index], index, self.size), 0]
            entry[1] += 1
            if entry[1] == self.size:
                del self._data[index]
            return entry[0]


def tolerance(case: Case, xs: list[np.ndarray], size: int) -> np.ndarray | float:
    """Bound of the reassociation + rounding error of a float reduction (0 for exact results)."""
    if not case.dtype.is_float or case.redop in (ReduceOp.MAX, ReduceOp.MIN):
        return 0.0
    eps = float(np.finfo(np.float32 if case.dtype is DataType.BFP16 else case.dtype.numpy).eps)
    if case.dtype is DataType.BFP16:
        eps = 2.0 ** -7
    wide = [x.astype(np.float64) for x in xs]
    scale = sum(np.abs(w) for w in wide) if case.redop is ReduceOp.SUM else \
        np.abs(np.prod(wide, axis=0))
    return (size + 1) * eps * scale


def buffers(case: Case, x: np.ndarray, size: int, rank: int) -> dict[str, np.ndarray]:
    c, dt = case.count, case.dtype.numpy
    n_out = {OpType.ALLGATHER: size * c, OpType.ALLTOALL: size * c}.get(case.op, c)
    if case.op is OpType.BROADCAST:
        buf = x.copy() if rank == case.root else np.full(c, 3, dt)
        return {"send": buf, "recv": buf}
    if case.inplace and case.op is OpType.ALLGATHER:
        recv = np.full(n_out, 3, dt)
        recv[:c] = x
        return {"send": recv[:c], "recv": recv}
    if case.inplace and case.op is OpType.REDUCE_SCATTER:
        send = x.copy()
        return {"send": send, "recv": send[:c]}
    if case.inplace:
        buf = x.copy()
        return {"send": buf, "recv": buf}
    return {"send": x.copy(), "recv": np.full(n_out, 3, dt)}


def expected(case: Case, data: CaseData, size: int, rank: int, before: np.ndarray):
    """(expected recv contents, error bound: 0 for exact) of ``rank``."""
    c, op, xs = case.count, case.op, data.xs
    if op in REDUCING:
        if op is OpType.REDUCE_SCATTER:
            sl = slice(rank * c, (rank + 1) * c)
            return data.total[sl], (data.tol[sl] if not np.isscalar(data.tol) else data.tol)
        if op is OpType.REDUCE and rank != case.root:
            return before, 0.0
        return data.total, data.tol
    if op is OpType.ALLGATHER:
        return np.concatenate(xs), 0.0
    if op is OpType.BROADCAST:
        return xs[case.root], 0.0
    if op is OpType.ALLTOALL:
        return np.concatenate([x[rank * c:(rank + 1) * c] for x in xs]), 0.0
    return xs[(rank - 1) % size], 0.0          # SEND: a ring of pairs r -> r+1


def run_case(case: Case, data: CaseData, size: int, rank: int, transport, comm_id: int,
             seq: int) -> tuple[str | None, bytes]:
    """Run one case on this rank; returns (failure text or None, digest of the result)."""
    bufs = buffers(case, data.xs[rank], size, rank)
    before = bufs["recv"].copy()
    fp = Fingerprint.make(case.op, case.count, case.dtype, case.redop, case.root)
    isz, peers = case.dtype.itemsize, list(range(size))
    if case.op is OpType.SEND:
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        out = schedule.build(OpType.SEND, rank, size, case.count, isz, SLICE, peer=nxt)
        inn = schedule.build(OpType.RECV, rank, size, case.count, isz, SLICE, peer=prv)
        executor.run(out, bufs, None, case.dtype, transport, comm_id, seq, fp, peers, TIMEOUT)
        executor.run(inn, bufs, None, case.dtype, transport, comm_id, seq, fp, peers, TIMEOUT)
    else:
        steps = schedule.build(case.op, rank, size, case.count, isz, SLICE, root=case.root,
                               inplace=case.inplace)
        executor.run(steps, bufs, case.redop, case.dtype, transport, comm_id, seq, fp, peers,
                     TIMEOUT, rank=rank)
    got = bufs["recv"]
    want, tol = expected(case, data, size, rank, before)
    digest = hashlib.blake2b(got.tobytes(), digest_size=16).digest() \
        if case.op is OpType.ALLREDUCE else b""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"shape/dtype {got.dtype}{got.shape} != {want.dtype}{want.shape}", digest
    if np.isscalar(tol) and tol == 0.0:
        ok = got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()
    else:
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        ok = bool((err <= tol).all())
    if ok:
        return None, digest
    bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))[:3]
    return f"wrong bytes at {bad.tolist()} (got {got[:4]} want {want[:4]})", digest


def run_batch(size: int, cases: list[Case]) -> None:
    """All cases on ``size`` rank threads; asserts results, and bitwise-equal all_reduce outputs."""
    fab, comm_id = fabric(size), next(_comm_ids)
    failures: list[str] = []
    digests = [[b""] * size for _ in cases]
    shared = SharedCases(cases, size)

    def worker(rank: int) -> None:
        t = fab.transport(rank)
        for i, case in enumerate(cases):
            try:
                failure, digests[i][rank] = run_case(case, shared.get(i), size, rank, t, comm_id,
                                                     i + 1)
            except BaseException as e:  # noqa: BLE001 -- report, then stop the other ranks
                failures.append(f"rank {rank} {case}: {type(e).__name__}: {e}")
                t.abort(comm_id, f"rank {rank} failed: {e!r}")
                return
            if failure:
                failures.append(f"rank {rank} {case}: {failure}")

    threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "rank threads hung"
    assert not failures, f"{len(failures)} failures, first: " + "\n".join(failures[:5])
    for i, case in enumerate(cases):
        if case.op is OpType.ALLREDUCE:
            assert len(set(digests[i])) == 1, f"all_reduce results differ across ranks: {case}"
    for r in range(size):
        assert fab.transport(r).pending() == 0, "messages left undelivered"


@pytest.mark.parametrize("size,op", [(n, op) for op in REDUCING + OTHERS for n in SIZES
                                     if n > 1 or op is not OpType.SEND])   # p2p: two ranks
def test_collective_matrix(size, op):
    run_batch(size, cases_for(op, size))


@pytest.mark.parametrize("size", SIZES)
def test_barrier_and_tree_algorithms(size):
    fab, comm_id = fabric(size), next(_comm_ids)
    errors: list = []
    state = {"entered": 0}
    lock = threading.Lock()

    def worker(rank):
        t = fab.transport(rank)
        try:
            for seq in range(1, 6):
                time.sleep(0.002 * ((rank * 7 + seq) % 3))
                with lock:
                    state["entered"] += 1
                fp = Fingerprint.make(OpType.BARRIER, 0)
                executor.run(schedule.build(OpType.BARRIER, rank, size, 0, 1, SLICE), {}, None,
                             None, t, comm_id, seq, fp, list(range(size)), TIMEOUT)
                with lock:   # nobody leaves barrier `seq` before everyone entered it
                    if state["entered"] < seq * size:
                        errors.append(f"rank {rank} left barrier {seq} early")
            for seq, op in enumerate([OpType.BROADCAST, OpType.REDUCE], start=10):
                x = (np.arange(5000, dtype=np.int64) + 1) * (rank + 1)
                root = seq % size
                bufs = {"send": x.copy(), "recv": x.copy()}
                steps = schedule.build(op, rank, size, 5000, 8, 1024, root=root, algo="tree")
                fp = Fingerprint.make(op, 5000, "int64", "sum", root)
                executor.run(steps, bufs, ReduceOp.SUM, DataType.INT64, t, comm_id, seq, fp,
                             list(range(size)), TIMEOUT)
                base = np.arange(5000, dtype=np.int64) + 1
                if op is OpType.BROADCAST:
                    want = base * (root + 1)
                else:
                    want = base * (size * (size + 1) // 2) if rank == root else x
                if not np.array_equal(bufs["recv"], want):
                    errors.append(f"rank {rank} tree {op} wrong")
        except Exception as e:  # noqa: BLE001
            errors.append(f"rank {rank}: {e!r}")
            t.abort(comm_id, repr(e))

    threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors


# --- failures ---------------------------------------------------------------------------------

def _spawn(fns):
    results: dict[int, object] = {}

    def wrap(r, fn):
        try:
            results[r] = fn()
        except BaseException as e:  # noqa: BLE001
            results[r] = e

    threads = [threading.Thread(target=wrap, args=(r, fn), daemon=True) for r, fn in enumerate(fns)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return results


def _allreduce(fab, rank, size, comm_id, seq, count=64, fp=None, timeout=TIMEOUT, on_wait=None,
               peers=None):
    x = np.full(count, rank + 1, np.float32)
    bufs = {"send": x, "recv": np.empty_like(x)}
    fp = fp or Fingerprint.make(OpType.ALLREDUCE, count, "fp32", "sum")
    peers = peers or list(range(size))
    steps = schedule.build(OpType.ALLREDUCE, rank, size, count, 4, SLICE)
    executor.run(steps, bufs, ReduceOp.SUM, "fp32", fab.transport(peers[rank]), comm_id, seq, fp,
                 peers, timeout, on_wait, rank=rank)
    return bufs["recv"]


def test_mismatch_is_reported_on_every_rank_with_both_calls():
    fab, comm_id = fabric(2), next(_comm_ids)
    other = Fingerprint.make(OpType.ALLGATHER, 32, "fp32")
    t0 = time.monotonic()
    res = _spawn([lambda: _allreduce(fab, 0, 2, comm_id, 12),
                  lambda: _allreduce(fab, 1, 2, comm_id, 12, fp=other)])
    assert time.monotonic() - t0 < 5
    for r in (0, 1):
        e = res[r]
        assert isinstance(e, CollectiveMismatchError), e
        assert e.seq == 12 and e.ranks == [r, 1 - r]
    assert str(res[0]).startswith(
        "seq 12: rank 0 ALLREDUCE(count=64, FP32, SUM) vs rank 1 ALLGATHER(count=32, FP32)")
    for r in (0, 1):
        fab.transport(r).forget(comm_id)


def test_timeout_names_the_peer_and_the_wait():
    fab, comm_id = fabric(3), next(_comm_ids)
    waits: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(HcclTimeoutError) as ei:
        _allreduce(fab, 1, 3, comm_id, 4, timeout=0.2,
                   on_wait=lambda p, sending: waits.append((p, sending)))
    assert 0.2 <= time.monotonic() - t0 < 10      # at least the timeout; upper: load slack
    e = ei.value
    assert (e.peer, e.seq, e.rank, e.timeout) == (0, 4, 1, 0.2) and e.waited >= 0.2
    assert waits == [(0, False)] and isinstance(e, TimeoutError)   # a message, not a delivery
    fab.transport(1).forget(comm_id)
    fab.transport(2).forget(comm_id)


def test_abort_by_a_peer_raises_remote_rank_error():
    fab, comm_id = fabric(3), next(_comm_ids)

    def aborter():
        time.sleep(0.05)
        fab.transport(2).abort(comm_id, "rank 2 hit an exception")

    res = _spawn([lambda: _allreduce(fab, 0, 3, comm_id, 1),
                  lambda: _allreduce(fab, 1, 3, comm_id, 1), aborter])
    for r in (0, 1):
        assert isinstance(res[r], RemoteRankError), res[r]
        assert res[r].rank == 2 and "exception" in res[r].reason
    for r in range(3):
        fab.transport(r).forget(comm_id)


def test_sub_communicator_maps_comm_ranks_to_world_ranks():
    fab, comm_id = fabric(5), next(_comm_ids)
    peers = [4, 1, 3]                              # comm rank -> world rank
    waits: dict[int, list] = {r: [] for r in range(3)}
    res = _spawn([lambda r=r: _allreduce(fab, r, 3, comm_id, 1, count=10, peers=peers,
                                         on_wait=lambda p, _, r=r: waits[r].append(p))
                  for r in range(3)])
    for r in range(3):
        np.testing.assert_array_equal(res[r], np.full(10, 6, np.float32))
        assert set(waits[r]) == {(r - 1) % 3}       # on_wait gets comm ranks


def test_buffers_are_checked_before_anything_is_sent():
    fab, comm_id = fabric(2), next(_comm_ids)
    steps = schedule.build(OpType.ALLREDUCE, 0, 2, 100, 4, SLICE)
    fp = Fingerprint.make(OpType.ALLREDUCE, 100, "fp32", "sum")
    small = {"send": np.zeros(100, np.float32), "recv": np.zeros(99, np.float32)}
    with pytest.raises(InvalidArgumentError, match="recv"):
        executor.run(steps, small, ReduceOp.SUM, "fp32", fab.transport(0), comm_id, 1, fp,
                     [0, 1], 1)
    with pytest.raises(InvalidArgumentError, match="send"):
        executor.run(steps, {"recv": small["send"]}, ReduceOp.SUM, "fp32", fab.transport(0),
                     comm_id, 1, fp, [0, 1], 1)
    assert fab.transport(1).pending() == 0


class _ZeroCopyHandle:
    def __init__(self, log, payload):
        self.log, self.payload, self.snapshot, self.finished = log, payload, bytes(payload), False

    def done(self):
        return self.finished

    def wait(self, timeout=None):
        # the payload must be untouched until the transport is done with it
        assert bytes(self.payload) == self.snapshot, "payload modified before send completed"
        self.log.append(("wait", len(self.snapshot)))
        self.finished = True


class _LoopbackTransport(Pair):
    """Zero-copy single-rank stand-in, its own only pair: send keeps a view, a receive hands
    back the bytes sent (and is never there at once, so it is always waited for)."""

    def __init__(self):
        self.log, self.box = [], {}

    def pair(self, peer):
        return self

    def send(self, comm_id, seq, step, fp, payload):
        h = _ZeroCopyHandle(self.log, payload)
        self.box[step] = bytes(payload)
        self.log.append(("send", step))
        return h

    def try_recv(self, comm_id, seq, step, fp, consume):
        return False

    def recv_into(self, comm_id, seq, step, fp, timeout, consume):
        self.log.append(("recv", step))
        consume(memoryview(self.box.pop(step)))


def test_writes_wait_for_pending_zero_copy_sends_that_read_them():
    from hccl.schedule import Copy, Recv, Send
    t = _LoopbackTransport()
    send = np.arange(8, dtype=np.uint8)
    recv = np.zeros(8, np.uint8)
    steps = [Send(0, "recv", 0, 4, 0),           # zero-copy of recv[0:4]
             Send(0, "send", 0, 4, 1),
             Copy("send", 4, "recv", 4, 4),      # disjoint from the pending send: no wait
             Recv(0, "recv", 0, 4, 1),           # overwrites recv[0:4]: waits send 0 first,
             Recv(0, "recv", 4, 4, 0)]           # before the wait for the message (the consumer
    executor.run(steps, {"send": send, "recv": recv}, None, "uint8", t, 1, 1,   # never waits)
                 (0, 8, 7, -1, -1), [0], 1.0)
    assert t.log == [("send", 0), ("send", 1), ("wait", 4), ("recv", 1), ("recv", 0), ("wait", 4)]
    assert recv.tolist() == [0, 1, 2, 3, 0, 0, 0, 0]
