"""A rank killed, exiting, stopped or losing its sockets in a long loop of collectives, with no
npurun (root-info init, ranks started by the test): every other rank gets an error naming it
within a stated bound (docs/reliability.md, "Faults"), and nothing is left behind.

Bound of a dead rank: the rank waiting for it checks its process every NPUSIM_LIVENESS_INTERVAL
(0.5 s), still takes what it sent for DEAD_PEER_GRACE (2 s), then aborts the communicator on every
rank naming it: 2.5 s (bounds.DEAD_PEER), asserted with tests/bounds.py's slack for a loaded machine
(bounds.DEAD_PEER_ASSERTED); a survivor that only times out would take HCCL_EXEC_TIMEOUT (120 s
here) and fail them. A fault from outside comes once every rank has completed a collective
(``running.<rank>``), after a chosen delay: the delay places the fault, it synchronizes nothing.
"""
from __future__ import annotations

import os
import random
import re
import signal
import time

import pytest

from hccl import config
from hccl.transport.base import DEAD_PEER_GRACE
from tests import bounds
from tests.leakcheck import LeakCheck, wait_for
from tests.faults.faultlib import BIG, Ranks, read

BOUND = bounds.DEAD_PEER_ASSERTED
N = 3
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "docs", "reliability.md")


def test_the_bound_is_the_code_and_the_page(monkeypatch):
    """The stated bound is made of the code's defaults, and docs/reliability.md says the same
    numbers in its prose (the table is generated; the prose is checked here)."""
    monkeypatch.delenv("NPUSIM_LIVENESS_INTERVAL", raising=False)
    assert config.liveness_interval() == bounds.LIVENESS
    assert bounds.DEAD_PEER == config.liveness_interval() + DEAD_PEER_GRACE
    page = open(DOC, encoding="utf-8").read()
    said = {k: float(re.search(rx, page).group(1)) for k, rx in (
        ("liveness", r"`NPUSIM_LIVENESS_INTERVAL` \(s, ([\d.]+)\)"),
        ("grace", r"`DEAD_PEER_GRACE` \(([\d.]+) s\)"),
        ("heartbeat", r"`NPUSIM_HEARTBEAT_TIMEOUT` \(s, ([\d.]+)\)"))}
    monkeypatch.delenv("NPUSIM_HEARTBEAT_TIMEOUT", raising=False)
    assert said == {"liveness": config.liveness_interval(), "grace": DEAD_PEER_GRACE,
                    "heartbeat": config.heartbeat_timeout()}, said


def run(tmp_path, plan, act=None, n=N, extra=None, result_timeout=BOUND + 30):
    """Run the ranks; ``act(ranks)`` -> fault time (else the victim's own 'dying' time)."""
    with LeakCheck(grace=15) as lc:
        ranks = Ranks(tmp_path, n, plan, lc.env, extra)
        try:
            ranks.wait_ready()
            t_fault = act(ranks) if act else None
            survivors = [r for r in range(n) if r != plan["victim"]]
            results = ranks.results(survivors, result_timeout)
            if t_fault is None:
                t_fault = read(ranks.path(f"dying.{plan['victim']}"))["t"]
            codes = ranks.wait_exit()
        finally:
            ranks.close()
    return results, t_fault, codes


def wait_running(ranks, timeout=60):
    """Every rank completed its first collective (rank_prog writes ``running.<rank>``)."""
    wait_for(lambda: all(os.path.exists(ranks.path(f"running.{r}")) for r in range(ranks.n))
             or any(p.poll() is not None for p in ranks.procs), timeout, what="ranks running")


def sigkill_after(delay, victim):
    def act(ranks):
        wait_running(ranks)
        time.sleep(delay)   # where the fault lands in the loop of collectives (not a wait)
        pid = read(ranks.path(f"ready.{victim}"))["pid"]
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        return t
    return act


def assert_named(results, victim, t_fault):
    lat = {r: round(res["t"] - t_fault, 2) for r, res in results.items() if "t" in res}
    print(f"observed: rank {victim} down -> survivors' errors after {lat} s")
    for r, res in results.items():
        assert "type" in res, f"rank {r} finished without an error: {res}"
        assert res["type"] == "RemoteRankError", (r, res)
        assert res["rank"] == victim, (r, res)
        assert f"rank {victim}" in res["text"], (r, res)
        assert res["t"] - t_fault < BOUND, (r, res["t"] - t_fault, res)


POINTS = [
    # (victim, how, at, count, delay): how=None is an external SIGKILL after `delay` seconds
    pytest.param(1, "kill", 0, BIG, 0, id="killed-before-first-collective"),
    pytest.param(2, "kill", 3, BIG, 0, id="killed-between-collectives", marks=pytest.mark.slow),
    pytest.param(1, None, -1, BIG, 0.7, id="sigkill-during-shm-collectives-a"),
    pytest.param(2, None, -1, BIG, 1.9, id="sigkill-during-shm-collectives-b",
                 marks=pytest.mark.slow),
    pytest.param(1, None, -1, 1000, 1.3, id="sigkill-during-small-collectives"),
    pytest.param(0, None, -1, BIG, 1.1, id="sigkill-rank0-store-host"),
    pytest.param(1, "exit", 4, BIG, 0, id="exits-between-collectives", marks=pytest.mark.slow),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("victim,how,at,count,delay", POINTS)
def test_dead_rank_is_named_by_every_survivor(tmp_path, victim, how, at, count, delay):
    plan = {"count": count, "iters": 10 ** 6, "victim": victim, "at": at, "how": how}
    act = sigkill_after(delay + random.random() * 0.3, victim) if how is None else None
    results, t_fault, codes = run(tmp_path, plan, act)
    assert_named(results, victim, t_fault)
    assert codes[victim] == (3 if how == "exit" else -signal.SIGKILL)
    assert all(c == 0 for r, c in enumerate(codes) if r != victim), codes


@pytest.mark.timeout(150)
def test_dead_rank_is_named_without_shared_memory(tmp_path):
    plan = {"count": BIG, "iters": 10 ** 6, "victim": 2, "at": -1, "how": None}
    results, t_fault, _ = run(tmp_path, plan, sigkill_after(1.0, 2), extra={"NPUSIM_SHM": "0"})
    assert_named(results, 2, t_fault)


@pytest.mark.timeout(150)
def test_stopped_rank_is_a_timeout_not_a_death(tmp_path):
    """SIGSTOP: the process lives, so no rank may call it gone; the waits end at
    HCCL_EXEC_TIMEOUT (4 s here) with a timeout that the abort carries to every rank."""
    timeout = bounds.STOP_TIMEOUT
    plan = {"count": BIG, "iters": 10 ** 6, "victim": 1, "at": -1, "how": None}

    def stop(ranks):
        wait_running(ranks)
        pid = read(ranks.path("ready.1"))["pid"]
        t = time.time()
        os.kill(pid, signal.SIGSTOP)
        return t
    with LeakCheck(grace=15) as lc:
        ranks = Ranks(tmp_path, N, plan, lc.env, {"HCCL_EXEC_TIMEOUT": str(timeout)})
        try:
            ranks.wait_ready()
            t_fault = stop(ranks)
            results = ranks.results([0, 2], bounds.STOPPED_ASSERTED + 30)
        finally:
            ranks.close()   # SIGKILL ends the stopped rank too
    print(f"observed: stopped -> errors after "
          f"{ {r: round(res['t'] - t_fault, 2) for r, res in results.items()} } s")
    for r, res in results.items():
        assert res.get("type") in ("HcclTimeoutError", "RemoteRankError"), (r, res)
        assert "timed out" in res["text"] and "is gone" not in res["text"], (r, res)
        assert res["t"] - t_fault < bounds.STOPPED_ASSERTED, (r, res["t"] - t_fault)
    assert any("rank 1" in res["text"] for res in results.values()), results


@pytest.mark.timeout(150)
def test_rank_whose_transport_closed_is_named(tmp_path):
    """The victim closes its transport (sockets gone, process alive): the survivors' links to
    it broke for good, so they name it within the dead-rank bound; the victim's own next
    collective fails as 'transport closed'."""
    plan = {"count": BIG, "iters": 10 ** 6, "victim": 1, "at": 3, "how": "close"}
    results, t_fault, codes = run(tmp_path, plan)
    assert_named(results, 1, t_fault)
    victim = read(os.path.join(tmp_path, "result.1"))
    assert victim["type"] == "HcclError" and "transport was closed" in victim["text"], victim
    assert codes == [0, 0, 0]


@pytest.mark.timeout(150)
def test_rank_whose_connections_are_reset_is_named(tmp_path):
    """The victim's TCP connections are shut down under its transport and it pauses 3 s: ZeroMQ
    would reconnect and may have lost what was in flight, so a rank that waits on a peer whose
    link broke names it after a liveness check and the grace (it cannot tell loss from delay).
    Every rank fails with a named error, and every message names the victim (as the rank gone,
    or as the rank that saw its peers gone). Over sockets only (NPUSIM_SHM=0): ranks of one
    node talk through shared memory and open no socket to each other until the ring overflows,
    so there is no connection to reset there."""
    plan = {"count": BIG, "iters": 10 ** 6, "victim": 1, "at": 3, "how": "reset"}
    with LeakCheck(grace=15) as lc:
        ranks = Ranks(tmp_path, N, plan, lc.env, extra={"NPUSIM_SHM": "0"})
        try:
            ranks.wait_ready()
            results = ranks.results(range(N), BOUND + 30)
            t_fault = read(ranks.path("dying.1"))["t"]
            ranks.wait_exit()
        finally:
            ranks.close()
    print(f"observed: reset -> errors after "
          f"{ {r: round(res['t'] - t_fault, 2) for r, res in results.items()} } s")
    for r, res in results.items():
        assert res.get("type") == "RemoteRankError", (r, res)
        assert "rank 1" in res["text"], (r, res)
        assert res["t"] - t_fault < BOUND, (r, res["t"] - t_fault)
