"""One dense npu tensor's all_reduce through the "hccl" backend takes a short path
(hccl/torch/npu.py: allreduce_one): a collective done at the call completes its Work at once,
a late one still orders the caller's stream and completes its future; results as before."""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")

import launcher  # noqa: E402

import torch_npu_fast_cases  # noqa: E402


@pytest.mark.timeout(180)
def test_the_short_path_gives_the_results_and_works_of_the_long_one():
    r0, r1 = launcher.spawn(torch_npu_fast_cases.fast_allreduce, 2, timeout=150)
    for rank, r in enumerate((r0, r1)):
        assert r["future"] == [[3.0, 3.0], [6.0, 6.0], [12.0, 12.0]], r
        assert r["x"] == [12.0, 12.0] and r["calls_added"] == 0
        assert r["late"] == [3.0, 3.0] == r["late_future"] and r["late_completed"]
        assert r["avg"] == [0.5] * 4 and r["bool"] == [True, False]
        assert r["nc"] == [0.0, 8.0]
        assert r["complex"] == [[1.0, 2.0], [1.0, 2.0]]
    # rank 0 waited for nobody: its call handed the rest to the stream, wait() returned
    assert not r0["late_pending"] and r0["late_wait_s"] < 0.25, r0
