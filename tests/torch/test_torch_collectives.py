"""Every torch collective on the "hccl" backend against torch's own gloo on the same inputs.

Each rank runs the whole suite twice in one process (gloo, then hccl), so torch is imported once
per rank; integers must agree bitwise, floats within reassociation error.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

import launcher  # noqa: E402
from tests.leakcheck import LeakCheck, MARKER  # noqa: E402

import torch_cases  # noqa: E402


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_collective_matches_gloo(world):
    with LeakCheck() as lc:
        results = launcher.spawn(torch_cases.both_backends, world, env={MARKER: lc.tag},
                                 timeout=130)
    for rank, res in enumerate(results):
        assert len(res["hccl"]) >= 50, sorted(res["hccl"])
        assert torch_cases.compare(res["gloo"], res["hccl"]) == [], f"rank {rank}"
    # the cases really moved data: a rank's all_reduce differs from its own input
    sums = [res["hccl"]["all_reduce/sum/torch.int64"][0] for res in results]
    assert all((s == sums[0]).all() for s in sums)
    gathered = results[0]["hccl"]["all_gather/torch.int32"]
    assert len(gathered) == world and not (gathered[0] == gathered[-1]).all()
