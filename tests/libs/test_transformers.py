"""transformers' Trainer and generate(), unchanged, at world 2: npu + hccl under npurun equals
CPU + gloo under torchrun bit for bit (tests/libs/trainer_job.py).

For each model, on every rank: the loss of every step of Trainer A (default TrainingArguments,
a checkpoint every 3 steps), the losses of Trainer B resumed from A's step-3 checkpoint (they
are A's last three, bitwise, on both devices), A's and B's final parameters (equal to each
other), GPT-2's tie of lm_head to wte kept, and ``generate()`` (greedy tokens and scores,
sampled tokens after ``torch.manual_seed``) of the final model on the rank's device.

Every TrainingArguments default is kept, ``ddp_find_unused_parameters`` included (True for a
PreTrainedModel): DDP's reducer with find_unused_parameters stages a flag map in pinned memory
from C++, which building that DDP over npu parameters provides by itself (runtime/torch/pinned.py,
``watch_ddp``; docs/torch.md, "Device contract", pinned memory).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")
pytest.importorskip("transformers", reason="transformers is not installed: pip install -e "
                    "'.[libs]'")

from tests.libs import harness  # noqa: E402

STEPS = 6


def _check_run(recs, device, model):
    for r, rec in enumerate(recs):
        assert rec["device"] == (f"npu:{r}" if device == "npu" else "cpu")
        assert len(rec["losses"]) == STEPS
        # B resumed at step 3 from A's checkpoint: it repeats A's last steps exactly
        assert rec["losses_resumed"] == rec["losses"][STEPS // 2:]
        p = rec["params"]
        a = {k[2:]: v for k, v in p.items() if k.startswith("a.")}
        b = {k[2:]: v for k, v in p.items() if k.startswith("b.")}
        harness.assert_same_bits(a, b, f"rank {r}: trainer A's and resumed B's parameters")
        if model == "gpt2":
            assert rec["tied"] == [True, True], "lm_head.weight is no longer transformer.wte"
            assert torch.equal(a["lm_head.weight"], a["transformer.wte.weight"])
        assert "rng_state_1.pth" in rec["checkpoint_files"]
        assert "greedy" in rec, "generate() did not run"
    # DDP keeps the replicas equal
    harness.assert_same_bits(recs[0]["params"], recs[1]["params"], "rank 0 and rank 1")


def _compare(tmp_path, model):
    args = ("--model", model, "--steps", str(STEPS))
    npu = harness.run("trainer_job.py", tmp_path, "npu", *args)
    cpu = harness.run("trainer_job.py", tmp_path, "cpu", *args)
    _check_run(cpu, "cpu", model)
    _check_run(npu, "npu", model)
    harness.assert_runs_equal(npu, cpu, keys=("losses", "losses_resumed", "greedy",
                                              "greedy_scores", "sampled"))
    print(f"trainer {model}: {harness.speed(npu, cpu)}")


@pytest.mark.timeout(600)
def test_trainer_gpt2_tied_npu_is_cpu_gloo_bitwise(tmp_path):
    _compare(tmp_path, "gpt2")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trainer_llama_npu_is_cpu_gloo_bitwise(tmp_path):
    _compare(tmp_path, "llama")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trainer_without_find_unused_parameters_npu_is_cpu_gloo_bitwise(tmp_path):
    """``ddp_find_unused_parameters=False``: DDP without the reducer's pinned flag map."""
    args = ("--model", "gpt2", "--steps", str(STEPS), "--no-find-unused")
    npu = harness.run("trainer_job.py", tmp_path, "npu", *args)
    cpu = harness.run("trainer_job.py", tmp_path, "cpu", *args)
    _check_run(cpu, "cpu", "gpt2")
    _check_run(npu, "npu", "gpt2")
    harness.assert_runs_equal(npu, cpu, keys=("losses", "losses_resumed", "greedy",
                                              "greedy_scores", "sampled"))
