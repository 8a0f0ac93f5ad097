"""A peer that died before our first message to it (#39: connections are made at first use):
at world 8 with a ring, a rank SIGKILLed right after init is never connected to by anyone
before it dies; its neighbours meet it lazily (the pair made, its inbox unmappable or its
address refusing) and every survivor still gets a RemoteRankError naming it, with the
operation, within the dead-rank bound (tests/bounds.py), shared memory on or off.

The helpers are test_rank_faults.py's (root-info ranks from rank_prog.py, no npurun)."""
from __future__ import annotations

import signal

import pytest

from tests import bounds
from tests.faults.faultlib import BIG
from tests.faults.test_rank_faults import assert_named, run

N = 8
VICTIM = 5


@pytest.mark.timeout(240)
@pytest.mark.parametrize("count,extra", [
    pytest.param(BIG, {}, id="shm-notices"),
    pytest.param(1000, {}, id="shm-slots"),
    pytest.param(BIG, {"NPUSIM_SHM": "0"}, id="sockets"),
])
def test_a_peer_dead_before_its_first_message_is_named(tmp_path, count, extra):
    plan = {"count": count, "iters": 10 ** 6, "victim": VICTIM, "at": 0, "how": "kill"}
    results, t_fault, codes = run(tmp_path, plan, n=N, extra={"HCCL_ALGO": "ring", **extra},
                                  result_timeout=bounds.DEAD_PEER_ASSERTED + 60)
    assert_named(results, VICTIM, t_fault)
    for r, res in results.items():
        assert "ALLREDUCE" in res["text"], (r, res)          # the operation is named
        assert res["iters"] == 0, (r, res)                   # it failed the first collective
    assert codes[VICTIM] == -signal.SIGKILL
    assert all(c == 0 for r, c in enumerate(codes) if r != VICTIM), codes
