"""ProcessTransport between 2 real processes (multiprocessing spawn): data, mismatch, abort, a dying peer.

Starting an interpreter costs about a second here, so one pair of processes runs every scenario in
order (module fixture) and each test checks its part of their reports.
"""
import multiprocessing as mp
import os
import queue
import secrets
import time

import pytest

FP = (1, 1 << 20, 4, 0, -1)
OTHER = (2, 1 << 19, 4, 0, -1)
REASON = "rank 0: kernel failed ✗"


def _rank_main(rank, size, secret, to_parent, from_parent):
    """One rank: bind, publish the address, connect, run the scenarios, report to the parent."""
    import numpy as np

    from hccl.transport import Aborted, FingerprintMismatch, PeerTimeout, ProcessTransport

    t = ProcessTransport(rank, size, secret)
    try:
        to_parent.put(("address", rank, t.address))
        t.connect(from_parent.get(timeout=30))
        peer = 1 - rank
        out = {}
        # 1. data: a 16 MiB zero-copy payload and a small copied one, received out of order
        big = np.full(4 << 20, rank + 0.5, np.float32)
        h = t.send(peer, 1, 1, 0, FP, big)
        t.send(peer, 1, 1, 1, FP, np.arange(10, dtype=np.int64) * rank)
        small = np.frombuffer(t.recv(peer, 1, 1, 1, FP, 20), np.int64)
        got = np.frombuffer(t.recv(peer, 1, 1, 0, FP, 20), np.float32)
        h.wait(20)
        out["big_ok"] = bool(got.shape == (4 << 20,) and np.all(got == peer + 0.5))
        out["small"] = small.tolist()
        # 2. mismatch: the ranks are in different collectives at seq 2
        mine = FP if rank == 0 else OTHER
        t.send(peer, 1, 2, 0, mine, b"seq 2")
        try:
            t.recv(peer, 1, 2, 0, mine, 20)
            out["mismatch"] = None
        except FingerprintMismatch as e:
            out["mismatch"] = (e.peer, e.seq, list(e.theirs), list(e.mine))
        # 3. abort: rank 0 gives up on comm 7; rank 1 learns it, and why, from the wire
        if rank == 0:
            t.abort(7, REASON)
        try:
            t.recv(peer, 7, 1, 0, FP, 20)
        except Aborted as e:
            out["aborted"] = (e.peer, e.reason)
        # 4. rank 1 dies without a goodbye once rank 0 has its last message
        if rank == 1:
            t.send(0, 2, 1, 0, FP, b"last words")
            t.recv(0, 2, 1, 9, FP, 20)          # the ack: sends are asynchronous
            to_parent.put(("result", rank, out))
            to_parent.close()
            to_parent.join_thread()
            os._exit(3)
        out["last"] = bytes(t.recv(1, 2, 1, 0, FP, 20))
        t.send(1, 2, 1, 9, FP, b"ack")
        try:
            t.recv(1, 2, 1, 1, FP, 0.5)
        except PeerTimeout as e:
            out["timeout"] = (e.peer, e.waited)
        h = t.send(1, 2, 2, 0, FP, np.ones(8 << 20, np.uint8))   # to the dead peer
        try:
            h.wait(0.2)
        except PeerTimeout:
            out["send_stuck"] = True
        t0 = time.monotonic()
        t.close()                               # must not hang with a dead peer
        out["close_s"] = time.monotonic() - t0
        to_parent.put(("result", rank, out))
    finally:
        t.close()


def _get(q, procs, timeout=100.0):
    """The next report of a rank; generous: starting interpreters is slow on a loaded machine
    (rank 1 exits on purpose in the last scenario, so a dead rank is no reason to stop early)."""
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no report from the ranks within {timeout} s (exit codes "
                             f"{[p.exitcode for p in procs]})") from None


@pytest.fixture(scope="module")
def reports():
    """Run both ranks once; return ({rank: report}, [exit codes]). Leaves no process behind."""
    ctx = mp.get_context("spawn")
    secret = secrets.token_bytes(32)
    to_parent = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(2)]
    procs = [ctx.Process(target=_rank_main, args=(r, 2, secret, to_parent, inboxes[r]),
                         daemon=True) for r in range(2)]
    try:
        for p in procs:
            p.start()
        addresses = {}
        while len(addresses) < 2:
            _, rank, addr = _get(to_parent, procs)
            addresses[rank] = addr
        for q in inboxes:
            q.put(addresses)
        results = {}
        while len(results) < 2:
            _, rank, out = _get(to_parent, procs)
            results[rank] = out
        for p in procs:
            p.join(30)
        codes = [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        for q in [to_parent, *inboxes]:
            q.close()
            q.join_thread()
    assert not any(p.is_alive() for p in procs) and mp.active_children() == []
    return results, codes


@pytest.mark.timeout(180)   # the first test also starts the ranks
def test_ranks_exit_cleanly_and_leave_no_process(reports):
    _, codes = reports
    assert codes == [0, 3]          # rank 1 dies on purpose in the last scenario


@pytest.mark.timeout(180)   # the first test also starts the ranks
def test_data_crosses_processes_intact(reports):
    results, _ = reports
    for rank in (0, 1):
        assert results[rank]["big_ok"] is True
        assert results[rank]["small"] == [i * (1 - rank) for i in range(10)]


@pytest.mark.timeout(180)   # the first test also starts the ranks
def test_both_ranks_see_the_mismatch(reports):
    results, _ = reports
    assert results[0]["mismatch"] == (1, 2, list(OTHER), list(FP))
    assert results[1]["mismatch"] == (0, 2, list(FP), list(OTHER))


@pytest.mark.timeout(180)   # the first test also starts the ranks
def test_abort_crosses_processes_with_its_reason(reports):
    results, _ = reports
    assert results[0]["aborted"] == (0, REASON)      # local abort
    assert results[1]["aborted"] == (0, REASON)      # told by rank 0


@pytest.mark.timeout(180)   # the first test also starts the ranks
def test_a_dead_peer_times_out_and_close_does_not_hang(reports):
    r = reports[0][0]
    assert r["last"] == b"last words"
    assert r["timeout"][0] == 1 and 0.45 <= r["timeout"][1] <= 10   # upper bound: load slack
    assert r["send_stuck"] is True
    assert r["close_s"] < 15                         # the bounded linger (1 s), not forever
