"""torch.distributed beyond DDP on the "hccl" backend, against gloo in the same run.

Each rank runs every case twice in one process (gloo, then hccl): gather, scatter, the object
collectives, ``*_coalesced``, bool tensors, BAND / BOR / BXOR, recv from any source, sparse
all_reduce, destroying a subgroup, functional collectives, and point-to-point posted receive
first (rings both ways, ``batch_isend_irecv`` with the receives first, a pipeline).
Integers and bools agree bitwise, floats within reassociation error.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install -e '.[torch]'")

import launcher  # noqa: E402
from tests.leakcheck import LeakCheck, MARKER  # noqa: E402

import torch_beyond_cases  # noqa: E402
import torch_cases  # noqa: E402


@pytest.mark.timeout(280)
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow), 4])
def test_beyond_ddp_matches_gloo(world):
    with LeakCheck() as lc:
        results = launcher.spawn(torch_beyond_cases.both_backends, world, env={MARKER: lc.tag},
                                 timeout=260)
    for rank, res in enumerate(results):
        assert len(res["hccl"]) >= 45, sorted(res["hccl"])
        assert torch_cases.compare(res["gloo"], res["hccl"]) == [], f"rank {rank}"
    hccl = [res["hccl"] for res in results]
    # the cases moved data: rank 0 heard from every other rank without naming them
    senders = hccl[0]["recv/any_source"][0]
    assert senders[:, 0].tolist() == list(range(1, world))
    assert senders[:, 1:].tolist() == [[10 * k + s for k in range(4)] for s in range(1, world)]
    # a ring posted receive-first delivered the neighbours' tensors, on every rank
    for rank in range(world):
        left = hccl[(rank - 1) % world]["p2p/batch_isend_irecv"]
        assert hccl[rank]["p2p/batch_isend_irecv"][0].tolist() == \
            [100 * ((rank - 1) % world) + k for k in range(3)], left
    assert hccl[0]["p2p/pipeline"][0].tolist() == [float(np.prod(range(2, world + 1)))] * 4
    # scatter gave each rank its own block, bool sums are logical or
    assert not np.array_equal(hccl[0]["scatter/root0"][0], hccl[1]["scatter/root0"][0])
    assert hccl[0]["bool/all_reduce/sum"][0].dtype == np.bool_
