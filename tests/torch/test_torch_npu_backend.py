"""The "hccl" backend on npu tensors (hccl/torch/npu.py): the collectives on the tensors' own
device memory with no staging buffer, ordered after the kernels that produced their inputs,
Work.wait() not blocking the host, one bound hccl Call for repeated calls; CPU tensors as
before."""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")

import launcher  # noqa: E402
from tests.leakcheck import LeakCheck, MARKER  # noqa: E402

import torch_npu_cases  # noqa: E402


@pytest.fixture(scope="module")
def two_ranks():
    with LeakCheck() as lc:
        return launcher.spawn(torch_npu_cases.npu_collectives, 2, env={MARKER: lc.tag},
                              timeout=150)


@pytest.mark.timeout(180)
def test_collectives_on_npu_tensors(two_ranks):
    r0, r1 = two_ranks
    for rank, r in enumerate(two_ranks):
        assert r["all_reduce"] == [3.0, 4.0, 6.0]
        assert r["avg"] == [0.5] * 3 and r["max"] == [1.0, 0.0]
        assert r["broadcast"] == [6.0, 6.0]
        assert r["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert r["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        # reduce_scatter_tensor: sum over ranks of arange(4) + rank, block ``rank``
        assert r["reduce_scatter_tensor"] == [[1.0, 3.0], [5.0, 7.0]][rank]
        assert r["reduce_scatter"] == [[1.0, 1.0], [3.0, 3.0]][rank]
        assert r["all_to_all_single"] == [[0.0, 10.0], [1.0, 11.0]][rank]
        assert r["non_contiguous"] == [[0.0, 8.0, 16.0], [2.0, 10.0, 18.0],
                                       [4.0, 12.0, 20.0], [6.0, 14.0, 22.0]]
        assert r["staged"] == [], "an npu collective staged a buffer"
    assert r0["reduce"] == [3.0] * 3 and r1["reduce"] == [2.0] * 3    # only the root's changes
    assert r1["recv"] == [7.0, 8.0]


@pytest.mark.timeout(180)
def test_stream_order_and_a_wait_that_does_not_block(two_ranks):
    for r in two_ranks:
        assert r["wait_returned_while_held"], "Work.wait() blocked the host on npu tensors"
        assert r["ordered"] == [5.0] * 4        # (0 + 2) + (1 + 2): after the queued mul_


@pytest.mark.timeout(180)
def test_repeated_calls_bind_once_and_allocate_nothing(two_ranks):
    for r in two_ranks:
        assert r["calls_added"] == 0 and r["memory_added"] == 0, r
        assert r["g"] == [64.0, 64.0]           # 2 ** 6 after six all_reduces at world 2
        assert r["staged_after"] == []
        assert r["cpu"] == [2.0] * 3 and r["cpu_staged"] == 1      # CPU tensors stage, as before
    for rank, r in enumerate(two_ranks):
        assert r["mixed"] == (f"InvalidArgumentError: allgather: tensors are on ['npu:{rank}', "
                              "'npu:7']; one collective takes tensors of one device (move them "
                              "with .to())")


@pytest.mark.timeout(180)
def test_device_id_subgroups_and_batched_p2p():
    with LeakCheck() as lc:
        results = launcher.spawn(torch_npu_cases.device_id_and_batched_p2p, 2,
                                 env={MARKER: lc.tag}, timeout=150)
    for rank, r in enumerate(results):
        assert r["all_reduce"] == [3.0] * 3 and r["subgroup"] == [6.0] * 3
        assert r["batch_p2p_npu"] == r["batch_p2p_cpu"] == [10.0 * (1 - rank)] * 2
