"""DeepSpeed ZeRO 1, 2 and 3, unchanged, at world 2 (tests/libs/deepspeed_job.py): on npu with
DeepSpeed's own NPU accelerator and "hccl" under npurun, bit for bit as on DeepSpeed's CPU
accelerator with gloo under torchrun: every loss, save_checkpoint / load_checkpoint resuming
exactly, no step skipped by the overflow check, the final parameters. Stage 2 runs by default;
stages 1 and 3 are slow (``python -m pytest -m slow tests/libs/test_deepspeed.py``).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")
pytest.importorskip("deepspeed", reason="deepspeed is not installed: DS_BUILD_OPS=0 pip install "
                    "-e '.[libs]'")

from tests.libs import harness  # noqa: E402

STEPS = 6


def _check_run(recs, device):
    for r, rec in enumerate(recs):
        assert rec["device"] == (f"npu:{r}" if device == "npu" else "cpu")
        assert rec["accelerator"] == ("NPU_Accelerator" if device == "npu" else "CPU_Accelerator")
        assert rec["skipped_steps"] == 0         # the overflow check saw finite gradients
        assert len(rec["losses"]) == STEPS
        assert rec["losses_resumed"] == rec["losses"][STEPS // 2:]
        p = rec["params"]
        harness.assert_same_bits({k[2:]: v for k, v in p.items() if k.startswith("a.")},
                                 {k[2:]: v for k, v in p.items() if k.startswith("b.")},
                                 f"rank {r}: the engine's and the resumed engine's parameters")
    harness.assert_same_bits(recs[0]["params"], recs[1]["params"], "rank 0 and rank 1")


def _compare(tmp_path, stage):
    args = ("--stage", str(stage), "--steps", str(STEPS))
    cpu = harness.run("deepspeed_job.py", tmp_path, "cpu", *args)
    _check_run(cpu, "cpu")
    npu = harness.run("deepspeed_job.py", tmp_path, "npu", *args)
    _check_run(npu, "npu")
    harness.assert_runs_equal(npu, cpu, keys=("losses", "losses_resumed"))
    print(f"deepspeed zero-{stage}: {harness.speed(npu, cpu)}")


@pytest.mark.timeout(600)
def test_zero2_npu_is_cpu_gloo_bitwise(tmp_path):
    _compare(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_zero1_npu_is_cpu_gloo_bitwise(tmp_path):
    _compare(tmp_path, 1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_zero3_npu_is_cpu_gloo_bitwise(tmp_path):
    _compare(tmp_path, 3)
