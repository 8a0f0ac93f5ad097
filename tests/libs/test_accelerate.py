"""accelerate's documented loop, unchanged, at world 2 (tests/libs/accelerate_job.py): on npu
under npurun and under ``accelerate launch`` (torch.distributed.run underneath; npusim's hccl
backend joins through torch's own rendezvous there), bit for bit as on CPU + gloo under
torchrun: every step's loss, ``save_state`` / ``load_state`` resuming exactly, the final
parameters. The ``accelerate launch`` test is slow (``python -m pytest -m slow
tests/libs/test_accelerate.py``).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")
pytest.importorskip("accelerate", reason="accelerate is not installed: pip install -e '.[libs]'")

from tests.libs import harness  # noqa: E402


def _check_run(recs, device):
    for r, rec in enumerate(recs):
        assert rec["device"] == (f"npu:{r}" if device == "npu" else "cpu")
        assert rec["backend"] == ("hccl" if device == "npu" else "gloo")
        assert rec["distributed_type"] == ("DistributedType.MULTI_NPU" if device == "npu"
                                           else "DistributedType.MULTI_CPU")
        # the optimizer made before prepare() updates the parameters the model computes with
        assert rec["optimizer_holds_model_params"]
        assert len(rec["losses"]) == 6
        assert rec["losses_resumed"] == rec["losses"][3:]      # load_state resumed exactly
        p = rec["params"]
        harness.assert_same_bits({k[2:]: v for k, v in p.items() if k.startswith("a.")},
                                 {k[2:]: v for k, v in p.items() if k.startswith("b.")},
                                 f"rank {r}: run 1's and the resumed run's parameters")
        assert {"model.safetensors", "optimizer.bin", "scheduler.bin",
                "random_states_1.pkl"} <= set(rec["state_files"])
    harness.assert_same_bits(recs[0]["params"], recs[1]["params"], "rank 0 and rank 1")


def _cpu(tmp_path):
    cpu = harness.run("accelerate_job.py", tmp_path, "cpu")
    _check_run(cpu, "cpu")
    return cpu


@pytest.mark.timeout(600)
def test_accelerate_loop_npu_is_cpu_gloo_bitwise(tmp_path):
    cpu = _cpu(tmp_path)
    npu = harness.run("accelerate_job.py", tmp_path, "npu")
    _check_run(npu, "npu")
    harness.assert_runs_equal(npu, cpu, keys=("losses", "losses_resumed"))
    print(f"accelerate: {harness.speed(npu, cpu)}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_accelerate_launch_on_npu_is_cpu_gloo_bitwise(tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2`` (torch.distributed.run underneath)
    drives the npu script as npurun does."""
    cpu = _cpu(tmp_path)
    launched = harness.run("accelerate_job.py", tmp_path, "npu", launcher="accelerate")
    _check_run(launched, "npu")
    harness.assert_runs_equal(launched, cpu, keys=("losses", "losses_resumed"))
    print(f"accelerate launch: {harness.speed(launched, cpu)}")
