"""DistributedDataParallel unchanged on the "hccl" backend, and npusim's errors through Work.wait().

One launch of two ranks serves both tests (torch's import costs seconds per process).
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

import launcher  # noqa: E402
from tests.leakcheck import LeakCheck, MARKER  # noqa: E402

import torch_cases  # noqa: E402


@pytest.fixture(scope="module")
def two_ranks():
    with LeakCheck() as lc:
        return launcher.spawn(torch_cases.ddp_and_mismatch, 2, env={MARKER: lc.tag}, timeout=130)


@pytest.mark.timeout(150)
def test_ddp_replicas_identical_and_equal_to_one_process(two_ranks):
    reps = [r["ddp"] for r in two_ranks]
    ref = torch_cases.single_process_reference()
    assert len(reps[0]) == len(ref) == 6
    for a, b in zip(reps[0], reps[1]):
        assert a.tobytes() == b.tobytes()            # bitwise identical replicas
    moved = max(float(np.max(np.abs(p))) for p in ref)
    for got, want in zip(reps[0], ref):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * moved)


@pytest.mark.timeout(150)
def test_async_work_wait_raises_the_mismatch(two_ranks):
    for rank, r in enumerate(two_ranks):
        res = r["mismatch"]
        assert res["first"] is not None, f"rank {rank}: wait() did not raise"
        is_mismatch, text = res["first"]
        assert is_mismatch, (rank, text)
        assert "ALLREDUCE" in text and "ALLGATHER" in text, text
        assert "torch_cases.py" in text        # the call site is the user's line, not torch's
        assert res["later"] is True and res["future_failed"], res


@pytest.mark.timeout(150)
def test_bad_arguments_raise_at_the_call_and_the_group_goes_on(two_ranks):
    for r in two_ranks:
        bad = r["bad"]
        assert "Cannot use ReduceOp.BAND with non-integral dtype torch.float32" in bad["band"]
        assert "AVG needs floating-point" in bad["int_avg"]
        assert "output has 3 elements but needs 4" in bad["gather_size"]
        assert "torch.float8_e5m2 is not supported" in bad["float8"]
        assert "input_split_sizes=[5, 0] must be 2" in bad["splits"]
        assert bad["after"] == [3.0, 3.0, 3.0]
