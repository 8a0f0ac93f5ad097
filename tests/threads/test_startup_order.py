"""Start-up ordering: no rank gets its communicator before every rank knows its peers' locality.

The regression test for the first-collective race (a fast rank's first shared-memory notice
reached a peer that had not yet learnt the sender shares its node, was dropped, and the ring
waited forever). Ranks are threads here, each with its own ZeroMQ transport and store client.
"""
import threading

import pytest

import hccl
from hccl.transport.process import ProcessTransport


@pytest.mark.timeout(60)
def test_no_rank_returns_from_init_before_every_rank_connected(monkeypatch):
    order, lock = [], threading.Lock()
    rank0_returned = threading.Event()
    real_connect = ProcessTransport.connect

    def slow_connect(self, addresses, nodes=None, segments=None):
        if self.rank == 2:
            # Give rank 0 every chance to return first; with the barrier it cannot, so this
            # waits out its 2 s (an upper bound, never an assumption about speed).
            rank0_returned.wait(2.0)
        real_connect(self, addresses, nodes, segments)
        with lock:
            order.append(f"connected {self.rank}")

    monkeypatch.setattr(ProcessTransport, "connect", slow_connect)
    info = hccl.get_root_info()
    comms, errors = {}, []

    def rank_main(r):
        try:
            comms[r] = hccl.comm_init_root_info(3, info, r)
            with lock:
                order.append(f"returned {r}")
            if r == 0:
                rank0_returned.set()
        except BaseException as e:   # reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not errors, errors
        connected = [order.index(f"connected {r}") for r in range(3)]
        returned = [order.index(f"returned {r}") for r in range(3)]
        assert max(connected) < min(returned), order
        # and each transport knows its (same-node) peers as shared-memory peers
        for r, c in comms.items():
            t = c.world.transport
            if t.channel is not None:
                assert t.local_peers == sorted({0, 1, 2} - {r})
    finally:
        for c in comms.values():
            c.destroy()
