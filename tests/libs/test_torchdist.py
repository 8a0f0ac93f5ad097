"""torch's distributed libraries, unchanged, at world 2 (tests/libs/torchdist_job.py): FSDP2
with a distributed checkpoint saved and loaded, DTensor tensor parallel, pipelining (2 stages),
autocast bf16 and fp16 with GradScaler under DDP. On npu + hccl under npurun, bit for bit as on
CPU + gloo under torchrun: every loss and the final parameters. FSDP2 runs by default, the
others are slow (``python -m pytest -m slow tests/libs/test_torchdist.py``).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")

from tests.libs import harness  # noqa: E402

STEPS = 6


def _compare(tmp_path, case):
    args = ("--case", case, "--steps", str(STEPS))
    cpu = harness.run("torchdist_job.py", tmp_path, "cpu", *args)
    npu = harness.run("torchdist_job.py", tmp_path, "npu", *args)
    for r in range(2):
        assert cpu[r]["device"] == "cpu" and npu[r]["device"] == f"npu:{r}"
    harness.assert_runs_equal(npu, cpu, keys=("losses",))
    print(f"{case}: {harness.speed(npu, cpu)}")
    return npu, cpu


@pytest.mark.timeout(600)
def test_fsdp2_with_distributed_checkpoint_npu_is_cpu_gloo_bitwise(tmp_path):
    npu, cpu = _compare(tmp_path, "fsdp2")
    for recs in (npu, cpu):
        for rec in recs:
            assert len(rec["losses"]) == STEPS
            # the second model, dcp.load-ed from the step-3 checkpoint, repeats the last steps
            assert rec["losses_resumed"] == rec["losses"][STEPS // 2:]
            p = rec["params"]
            harness.assert_same_bits({k[2:]: v for k, v in p.items() if k.startswith("a.")},
                                     {k[2:]: v for k, v in p.items() if k.startswith("b.")},
                                     "the trained and the dcp-resumed model")
        harness.assert_same_bits(recs[0]["params"], recs[1]["params"], "rank 0 and rank 1")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dtensor_tensor_parallel_npu_is_cpu_gloo_bitwise(tmp_path):
    npu, _ = _compare(tmp_path, "tp")
    assert len(npu[0]["losses"]) == STEPS
    harness.assert_same_bits(npu[0]["params"], npu[1]["params"], "rank 0 and rank 1")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pipelining_two_stages_npu_is_cpu_gloo_bitwise(tmp_path):
    npu, _ = _compare(tmp_path, "pp")
    assert npu[0]["losses"] == [] and len(npu[1]["losses"]) == 2 * STEPS   # 2 microbatches


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_autocast_bf16_npu_is_cpu_gloo_bitwise(tmp_path):
    npu, cpu = _compare(tmp_path, "amp-bf16")
    for recs in (npu, cpu):
        # the Linear's output in bf16, mse_loss on autocast's fp32 list
        assert recs[0]["dtypes"] == ["torch.bfloat16", "torch.float32"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_autocast_fp16_grad_scaler_npu_is_cpu_gloo_bitwise(tmp_path):
    npu, cpu = _compare(tmp_path, "amp-fp16")
    for recs in (npu, cpu):
        assert recs[0]["dtypes"] == ["torch.float16", "torch.float32"]
        # no step skipped: the scale never backed off from its initial 2**16
        assert recs[0]["scales"] == [65536.0] * STEPS


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp2_world_3_npu_is_cpu_hccl_and_gloo_up_to_the_sum_order(tmp_path):
    """At world 3 the losses are gloo's bitwise and the parameters npu+hccl's on CPU tensors
    (the device adds nothing); they differ from gloo's in the last bits of some values because
    hccl adds three ranks' gradients as (g0 + g1) + g2 and gloo's ring in another order for some
    elements (tests/torch/test_torch_npu_ddp.py shows it on one all_reduce). Measured: 2e-9
    relative in one weight after 6 steps."""
    args = ("--case", "fsdp2", "--steps", str(STEPS))
    npu = harness.run("torchdist_job.py", tmp_path, "npu", *args, world=3, timeout=800)
    cpu_hccl = harness.run("torchdist_job.py", tmp_path, "cpu", *args, "--backend", "hccl",
                           launcher="npurun", world=3, timeout=800)
    gloo = harness.run("torchdist_job.py", tmp_path, "cpu", *args, world=3, timeout=800)
    harness.assert_runs_equal(npu, cpu_hccl, keys=("losses", "losses_resumed"))
    for rn, rg in zip(npu, gloo):
        assert rn["losses"] == rg["losses"]
        for k, v in rg["params"].items():
            rel = float((rn["params"][k] - v).abs().max() / v.abs().max())
            assert rel < 1e-6, (k, rel)
