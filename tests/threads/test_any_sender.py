"""Receive from any source at the hccl level: ``Comm.wait_any_sender`` names the rank whose
next point-to-point message arrived, without taking it; then ``recv`` from it."""
from __future__ import annotations

import numpy as np
import pytest

import hccl
import runtime


def _gather_from_anyone(comm):
    if comm.rank != 0:
        buf = runtime.to_device(np.full(4, comm.rank, np.int32))
        comm.send(buf, 0)
        runtime.synchronize()
        return None
    got = {}
    for _ in range(comm.size - 1):
        src = comm.wait_any_sender(timeout=30)
        out = runtime.empty(4, np.int32)
        comm.recv(out, src)
        runtime.synchronize()
        got[src] = out.to_host().tolist()
    return got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 4])
def test_wait_any_sender_names_each_sender_once(ranks, size):
    got = ranks(size, _gather_from_anyone)[0]
    assert got == {r: [r] * 4 for r in range(1, size)}


def _nobody_sends(comm):
    if comm.rank == 0:
        with pytest.raises(hccl.HcclTimeoutError, match="any source"):
            comm.wait_any_sender(timeout=0.3)


@pytest.mark.timeout(60)
def test_wait_any_sender_times_out_naming_the_wait(ranks):
    ranks(2, _nobody_sends)
