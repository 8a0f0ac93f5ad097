"""Nothing lost when a rank dies: the training examples resume under npurun --max-restarts.

- random kills: a random rank SIGKILLed at a random moment, twice (after checkpoints exist),
  under ``npurun --max-restarts 3``: exit 0 and the final digest of an unfaulted run. The suite
  runs a few runs; ``python -m tests.faults.restart_harness --runs 20`` runs the 20 of
  docs/reliability.md ("Nothing lost");
- rank 0 SIGKILLed inside a checkpoint write: the job resumes from the previous checkpoint;
- a damaged newest checkpoint is refused (named, with why) and the older one used; one of
  another world size stops the job with the numbers;
- a restart is a fresh attempt: the failed attempt's segments are gone, its restart count is new.
"""
from __future__ import annotations

import io
import json
import os
import random
import re
import sys

import numpy as np
import pytest

from tests.leakcheck import LeakCheck, run_npurun
from tests.faults import restart_harness as harness

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE_RUNS = 3


def _check_runs(tmp_path, example: str, runs: int, seed: int) -> None:
    rng = random.Random(seed)
    ref = harness.run_once(example, str(tmp_path / "ref"), kills=0, rng=rng)
    assert ref.returncode == 0 and ref.digest, ref.output[-3000:]
    assert "resumed from step" not in ref.output
    for i in range(runs):
        o = harness.run_once(example, str(tmp_path / f"run{i}"), kills=2, rng=rng)
        assert o.returncode == 0, o.output[-4000:]
        assert o.digest == ref.digest, (i, o.kills, o.resumed, o.output[-4000:])
        assert len(o.kills) == 2 and len(o.resumed) == 2, o.output[-4000:]
        steps = [s for s, _ in o.resumed]
        assert 0 < steps[0] <= steps[1], steps
        # npurun's end summary: every attempt, its culprit and class, where the next resumed
        table = o.output[o.output.index("npurun: attempts of this job (3, --max-restarts 3):"):]
        for (attempt, rank, _), step in zip(o.kills, steps):
            # the killed rank is a culprit (torch's rank may crash too as its peer dies)
            assert re.search(rf"attempt {attempt}: failed: culprit rank\(s\) [\d, ]*\b{rank}\b"
                             rf"[\d, ]* \(dead\w*\)"
                             rf".*the next attempt resumed from step {step}, [\d.]+ s after "
                             rf"the failure", table), table
        assert "attempt 2: succeeded" in table, table


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_numpy_example_survives_two_random_kills(tmp_path):
    _check_runs(tmp_path, "train_ddp", SUITE_RUNS, seed=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_torch_example_survives_two_random_kills(tmp_path):
    pytest.importorskip("torch.distributed", reason="torch is not installed")
    _check_runs(tmp_path, "train_torch_ddp", SUITE_RUNS, seed=2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_rank0_killed_inside_a_checkpoint_write_resumes_from_the_previous(tmp_path, seed):
    nproc, args = harness.EXAMPLES["train_ddp"]
    args = dict(zip(args[::2], args[1::2]))
    args.update({"--steps": "60", "--checkpoint-every": "10"})  # checkpoints at 10, 20, ...
    args = [x for kv in args.items() for x in kv]
    ckpt = str(tmp_path / "ckpt")
    with LeakCheck(grace=15) as lc:
        ref = run_npurun("--nproc-per-node", str(nproc), harness.example_path("train_ddp"),
                         *args, "--checkpoint-dir", str(tmp_path / "ref"), env=lc.env,
                         cwd=str(tmp_path), timeout=300)
        res = run_npurun("--nproc-per-node", str(nproc), "--max-restarts", "1",
                         os.path.join(HERE, "ckpt_writer_killer.py"), "30", str(seed),
                         harness.example_path("train_ddp"), *args, "--checkpoint-dir", ckpt,
                         env=lc.env, cwd=str(tmp_path), timeout=300)
    out = res.stdout + res.stderr
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert res.returncode == 0, out[-4000:]
    assert "killer: SIGKILL inside the write of checkpoint 30" in out, out[-4000:]
    assert "[rank 0]: resumed from step 20" in out, out[-4000:]
    assert harness._last(harness.DIGEST, out) == harness._last(harness.DIGEST, ref.stdout)
    assert "the next attempt resumed from step 20" in out
    # the resumed job's saves removed what the killed writer left
    assert not [n for n in os.listdir(ckpt) if n.startswith(".")], os.listdir(ckpt)


def _train_ddp():
    sys.path.insert(0, os.path.dirname(harness.example_path("train_ddp")))
    import train_ddp
    return train_ddp


def _write(ckpt: str, step: int, world: int, hidden: int = 32) -> None:
    """A checkpoint of the numpy example as it writes them (world ``world``, width ``hidden``)."""
    ex = _train_ddp()
    lay = ex.Layout(hidden, 1 << 20)
    params = lay.init_params(0)
    buf = io.BytesIO()
    np.savez(buf, params=params, momentum=np.zeros_like(params), step=np.int64(step),
             losses=np.zeros(step))
    ex.checkpoint.save(ckpt, step, buf.getvalue(), ".npz", ex.checkpoint_meta(lay, world))


def _run_one_rank(tmp_path, ckpt: str, *extra: str):
    with LeakCheck() as lc:
        return run_npurun("--nproc-per-node", "1", harness.example_path("train_ddp"),
                          "--steps", "12", "--hidden", "32", "--batch", "64",
                          "--checkpoint-dir", ckpt, *extra, env=lc.env, cwd=str(tmp_path),
                          timeout=200)


@pytest.mark.timeout(300)
def test_truncated_newest_checkpoint_is_refused_and_the_older_used(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _write(ckpt, 5, world=1)
    _write(ckpt, 10, world=1)
    path = os.path.join(ckpt, "step-00000010.npz")
    with open(path, "r+b") as f:
        f.truncate(1000)
    res = _run_one_rank(tmp_path, ckpt)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert re.search(rf"checkpoint {re.escape(path)} refused: truncated: 1000 of \d+ bytes; "
                     r"trying an older one", out), out[-3000:]
    assert "[rank 0]: resumed from step 5" in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world, hidden, message", [
    (2, 32, r"step-00000010.json was written by a job of 2 ranks, this job has 1"),
    (1, 16, r"step-00000010.json: parameter 'W1' has shape \[32, 16\] there and \[32, 32\] in this model"),
])
def test_mismatched_checkpoint_stops_the_job_with_the_numbers(tmp_path, world, hidden,
                                                              message):
    ckpt = str(tmp_path / "ckpt")
    _write(ckpt, 10, world=world, hidden=hidden)
    res = _run_one_rank(tmp_path, ckpt)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert re.search(r"CheckpointMismatch: checkpoint \S*" + message, out), out[-3000:]
    assert "resumed from step" not in out
    assert sorted(os.listdir(ckpt)) == ["step-00000010.json", "step-00000010.npz"]


FRESH = """
import os, sys
job, attempt = os.environ["NPUSIM_JOB_ID"], os.environ["TORCHELASTIC_RESTART_COUNT"]
seg = f"/dev/shm/npusim-{job}-hccl-r0-{'a' * 16}"
if attempt == "0":
    open(seg, "wb").close()          # as a rank killed during communicator init leaves it
    sys.exit(3)
print(f"attempt {attempt}: segment of attempt 0 present: {os.path.exists(seg)}")
print("resumed from step 7")
"""


@pytest.mark.timeout(120)
def test_restart_is_a_fresh_attempt(tmp_path):
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "1", "--max-restarts", "1", str(script),
                         env=lc.env, cwd=str(tmp_path), timeout=100)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "[rank 0]: attempt 1: segment of attempt 0 present: False" in out, out
    assert re.search(r"attempt 0: failed: culprit rank\(s\) 0 \(error\): exited with code 3; "
                     r"the next attempt resumed from step 7, [\d.]+ s after the failure", out), out
    assert "attempt 1: succeeded" in out, out
