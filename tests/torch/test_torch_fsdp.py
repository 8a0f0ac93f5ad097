"""FSDP2 (``fully_shard``: DTensor parameters, functional collectives) on the "hccl" backend
trains a small MLP with the same losses as on gloo, in the same run."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install -e '.[torch]'")

import launcher  # noqa: E402
from tests.leakcheck import LeakCheck, MARKER  # noqa: E402

import torch_fsdp_cases  # noqa: E402


@pytest.mark.timeout(400)
def test_fsdp2_mlp_losses_equal_gloo():
    with LeakCheck() as lc:
        results = launcher.spawn(torch_fsdp_cases.both_backends, 2, env={MARKER: lc.tag},
                                 timeout=380)
    gloo, hccl = results[0]["gloo"], results[0]["hccl"]
    assert len(hccl) == torch_fsdp_cases.STEPS
    assert hccl[-1] < hccl[0]                       # it trained
    np.testing.assert_allclose(hccl, gloo, rtol=1e-12)
    assert results[1]["hccl"] == hccl               # every rank saw the same mean loss
