"""Communicator init over real processes: a rank that never arrives, and strangers on the wire."""
import multiprocessing as mp
import os
import socket
import struct
import sys
import time
import traceback

import pytest
import zmq

import hccl

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


def _init_only(rank, size, root_info, q):
    os.environ["HCCL_CONNECT_TIMEOUT"] = "2"
    t0 = time.monotonic()
    try:
        hccl.comm_init_root_info(size, root_info, rank)
        q.put((rank, "ok", time.monotonic() - t0))
    except hccl.HcclError as e:
        q.put((rank, f"{type(e).__name__}|{e.result.name}|{e}", time.monotonic() - t0))
    except BaseException:
        q.put((rank, traceback.format_exc(), 0))


@pytest.mark.timeout(60)
def test_a_rank_that_never_arrives_fails_init_naming_it():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    info = hccl.get_root_info()
    procs = [ctx.Process(target=_init_only, args=(r, 3, info, q), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = [q.get(timeout=40) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
    for rank, text, elapsed in results:
        kind, result, msg = text.split("|", 2)
        assert kind == "HcclTimeoutError" and result == "E_TIMEOUT", text
        assert "ranks [2] never arrived" in msg and "arrived: [0, 1]" in msg
        assert "HCCL_CONNECT_TIMEOUT=2" in msg
        assert 1.5 < elapsed < 2 + 20, elapsed      # the 2 s timeout; the rest is load slack


def _job_with_strangers(rank, size, root_info, q, rounds, go):
    try:
        sys.path.insert(0, TESTS)
        os.environ["NPUSIM_HBM_BYTES"] = str(1 << 30)
        import numpy as np
        import runtime
        runtime.set_device(rank)
        comm = hccl.comm_init_root_info(size, root_info, rank)
        q.put(("addr", rank, comm.world.transport.address))
        go.wait(60)                                        # the strangers have struck
        bad = 0
        for i in range(rounds):
            x = runtime.to_device(np.full(100_000, rank + i, np.int64))
            comm.all_reduce(x)
            got = x.to_host()
            bad += int(np.count_nonzero(got != sum(range(size)) + size * i))
        comm.world.transport.drops.wait_for(1, 10)         # the garbage was read and dropped
        drops = comm.world.transport.drops.dropped
        comm.destroy()
        q.put(("done", rank, (bad, drops)))
    except BaseException:
        q.put(("done", rank, traceback.format_exc()))


def _garbage(address: str, n: int = 50):
    """A stranger: random frames, a forged header with a wrong key, a huge announced size."""
    ctx = zmq.Context()
    try:
        s = ctx.socket(zmq.DEALER)
        s.linger = 3000               # deliver before closing (LINGER 0 would discard it)
        s.connect(address)
        for i in range(n):
            s.send_multipart([os.urandom(110 + i % 7), os.urandom(64)])
            s.send(b"NPUS" + struct.pack("!BB", 1, 1) + os.urandom(200))
            s.send_multipart([b"\x00" * 4, b"x" * 10])
        s.close()
        raw = socket.create_connection(tuple(address[len("tcp://"):].rsplit(":", 1)))  # not even ZMTP
        raw.sendall(b"\xff" + b"\x00" * 7 + b"\x7f" * 8 + os.urandom(64))
        raw.close()
    finally:
        ctx.term()


@pytest.mark.timeout(120)
def test_strangers_on_the_store_and_the_transport_are_dropped_and_the_job_is_correct():
    size, rounds = 3, 30
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    info = hccl.get_root_info()
    from hccl.init import _parse_root_info
    store_addr = f"tcp://127.0.0.1:{_parse_root_info(info)['port']}"
    _garbage(store_addr)                                   # before the job: the store survives
    go = ctx.Event()
    procs = [ctx.Process(target=_job_with_strangers, args=(r, size, info, q, rounds, go),
                         daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    try:
        results, struck = {}, 0
        while len(results) < size:
            kind, rank, value = q.get(timeout=90)
            if kind == "addr":                             # during the job: every rank's socket
                _garbage(value)
                _garbage(store_addr, 5)
                struck += 1
                if struck == size:
                    go.set()
            else:
                results[rank] = value
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    for rank, value in results.items():
        assert isinstance(value, tuple), value
        bad, drops = value
        assert bad == 0
    assert all(v[1] > 0 for v in results.values())       # every rank saw garbage and dropped it
