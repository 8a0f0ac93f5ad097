"""ZmqTransport between real processes (multiprocessing spawn): data, mismatch, abort, a dying peer.

Each test starts 2 fresh interpreters, so scenarios are grouped to keep the start-up cost low.
"""
import multiprocessing as mp
import os
import secrets
import time

import pytest

FP = (1, 1 << 20, 4, 0, -1)
OTHER = (2, 1 << 19, 4, 0, -1)


def _rank_main(rank, size, secret, scenario, to_parent, from_parent):
    """One rank: bind, publish the address, connect, run ``scenario``, report to the parent."""
    import numpy as np

    from hccl.transport import Aborted, FingerprintMismatch, PeerTimeout, ZmqTransport

    t = ZmqTransport(rank, size, secret)
    try:
        to_parent.put(("address", rank, t.address))
        t.connect(from_parent.get(timeout=20))
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        out = {}
        if scenario == "exchange":
            # a ring step with a 16 MiB zero-copy payload and a small one, then a mismatch
            big = np.full(4 << 20, rank + 0.5, np.float32)
            h = t.send(nxt, 1, 1, 0, FP, big)
            t.send(nxt, 1, 1, 1, FP, np.arange(10, dtype=np.int64) * rank)
            small = np.frombuffer(t.recv(prv, 1, 1, 1, FP, 20), np.int64)
            got = np.frombuffer(t.recv(prv, 1, 1, 0, FP, 20), np.float32)
            h.wait(20)
            out["big_ok"] = bool(got.shape == (4 << 20,) and np.all(got == prv + 0.5))
            out["small"] = small.tolist()
            t.send(nxt, 1, 2, 0, FP if rank == 0 else OTHER, b"seq 2")
            try:
                t.recv(prv, 1, 2, 0, FP if rank == 0 else OTHER, 20)
                out["mismatch"] = None
            except FingerprintMismatch as e:
                out["mismatch"] = (e.peer, e.seq, list(e.theirs), list(e.mine))
            # abort: rank 0 gives up on comm 7; rank 1 learns it (and why) from the wire
            if rank == 0:
                t.abort(7, "rank 0: kernel failed ✗")
            try:
                t.recv(0 if rank else 1, 7, 1, 0, FP, 20)
            except Aborted as e:
                out["aborted"] = (e.peer, e.reason)
        elif scenario == "peer_dies":
            if rank == 1:
                t.send(0, 1, 1, 0, FP, b"last words")
                t.recv(0, 1, 1, 9, FP, 20)     # rank 0 got them (sends are asynchronous)
                os._exit(3)                    # no close, no goodbye
            out["last"] = bytes(t.recv(1, 1, 1, 0, FP, 20))
            t.send(1, 1, 1, 9, FP, b"ack")
            try:
                t.recv(1, 1, 1, 1, FP, 0.5)
            except PeerTimeout as e:
                out["timeout"] = (e.peer, round(e.waited, 1))
            big = np.ones(8 << 20, np.uint8)
            h = t.send(1, 1, 2, 0, FP, big)    # to the dead peer
            try:
                h.wait(0.2)
            except PeerTimeout:
                out["send_stuck"] = True
        t0 = time.monotonic()
        t.close()                              # must not hang, even with a dead peer
        out["close_s"] = time.monotonic() - t0
        to_parent.put(("result", rank, out))
    finally:
        t.close()


def _run(size, scenario, timeout=30):
    ctx = mp.get_context("spawn")
    secret = secrets.token_bytes(32)
    to_parent = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(size)]
    procs = [ctx.Process(target=_rank_main, args=(r, size, secret, scenario, to_parent,
                                                  inboxes[r]), daemon=True)
             for r in range(size)]
    try:
        for p in procs:
            p.start()
        addresses = {}
        while len(addresses) < size:
            _, rank, addr = to_parent.get(timeout=timeout)
            addresses[rank] = addr
        for q in inboxes:
            q.put(addresses)
        expected = size - (1 if scenario == "peer_dies" else 0)
        results = {}
        while len(results) < expected:
            _, rank, out = to_parent.get(timeout=timeout)
            results[rank] = out
        for p in procs:
            p.join(timeout)
        return results, [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        for q in [to_parent, *inboxes]:
            q.close()
            q.join_thread()
        assert not any(p.is_alive() for p in procs)
        assert mp.active_children() == []


@pytest.mark.timeout(60)
def test_two_processes_exchange_detect_a_mismatch_and_abort():
    results, codes = _run(2, "exchange")
    assert codes == [0, 0]
    for rank in (0, 1):
        r = results[rank]
        peer = 1 - rank
        assert r["big_ok"] is True
        assert r["small"] == [i * peer for i in range(10)]
        mine, theirs = (FP, OTHER) if rank == 0 else (OTHER, FP)
        assert r["mismatch"] == (peer, 2, list(theirs), list(mine))
        assert r["aborted"] == (0, "rank 0: kernel failed ✗")   # rank 0 local, rank 1 told
        assert r["close_s"] < 1.5


@pytest.mark.timeout(60)
def test_a_dead_peer_times_out_and_close_does_not_hang():
    results, codes = _run(2, "peer_dies")
    assert codes == [0, 3]
    r = results[0]
    assert r["last"] == b"last words"
    assert r["timeout"][0] == 1 and 0.4 <= r["timeout"][1] <= 1.5
    assert r["send_stuck"] is True
    assert r["close_s"] < 2.5                  # the bounded linger (1 s), not forever
