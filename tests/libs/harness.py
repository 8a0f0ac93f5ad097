"""Run a tests/libs job on npu under npurun and on CPU + gloo under torchrun; read and compare.

``run(job, tmp_path, device, launcher)`` starts one launch of world 2 (leak-checked as every
multi-process test) and returns each rank's record (rank<R>.json) and parameters (rank<R>.pt);
``assert_same_bits`` compares two state dicts bit for bit (dtype, shape, values as integers).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.leakcheck import LeakCheck, run_npurun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2


def job_path(name: str) -> str:
    return os.path.join(HERE, name)


def run(job: str, tmp_path, device: str, *args: str, launcher: str | None = None,
        world: int = WORLD, timeout: float = 600, env_extra: dict | None = None) -> list[dict]:
    """One launch of ``job``: ``npurun`` (the default for npu), ``torchrun`` (the default for cpu)
    or ``accelerate`` (``accelerate launch --multi_gpu``, which runs torch.distributed.run).
    Returns the records of ranks 0..world-1, each with its parameters under "params" (or None)."""
    launcher = launcher or ("npurun" if device == "npu" else "torchrun")
    out = os.path.join(str(tmp_path), f"{os.path.splitext(job)[0]}-{device}-{launcher}")
    script = job_path(job)
    jargs = [script, "--device", device, "--out", out, *args]
    with LeakCheck() as lc:
        env = dict(lc.env)
        env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("OMP_NUM_THREADS", "1")
        env["TOKENIZERS_PARALLELISM"] = "false"
        env["HF_HUB_OFFLINE"] = "1"
        env.update(env_extra or {})
        if launcher == "npurun":
            res = run_npurun("--nproc-per-node", str(world), *jargs, env=env, cwd=str(tmp_path),
                             timeout=timeout)
        else:
            if launcher == "torchrun":
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc-per-node", str(world), *jargs]
            elif launcher == "accelerate":
                cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                       "--num_processes", str(world), "--num_machines", "1",
                       "--mixed_precision", "no", "--dynamo_backend", "no",
                       "--main_process_port", "0", *jargs]
            else:
                raise ValueError(f"launcher {launcher!r}: expected npurun, torchrun or accelerate")
            res = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True,
                                 text=True, timeout=timeout)
    if res.returncode != 0:
        raise AssertionError(f"{job} on {device} under {launcher} exited {res.returncode}:\n"
                             f"{res.stdout[-3000:]}\n{res.stderr[-6000:]}")
    return read(out, world)


def read(out: str, world: int = WORLD) -> list[dict]:
    import torch
    recs = []
    for r in range(world):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            rec = json.load(f)
        p = os.path.join(out, f"rank{r}.pt")
        rec["params"] = torch.load(p, weights_only=True) if os.path.exists(p) else None
        rec["out"] = out
        recs.append(rec)
    return recs


def bits(t):
    """A tensor's values as integers of its width (NaNs and -0.0 compare by their bits)."""
    import torch
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point or t.dtype.is_complex:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.view(width)
    return t


def differences(a: dict, b: dict) -> list[str]:
    """Names of the entries of two state dicts that are not bitwise equal (with why)."""
    out = []
    if set(a) != set(b):
        out.append(f"keys differ: {sorted(set(a) ^ set(b))}")
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            out.append(f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
        elif not bool((bits(x) == bits(y)).all()):
            rel = float(((x.double() - y.double()).abs().max()) / max(
                float(y.double().abs().max()), 1e-300))
            out.append(f"{k}: max rel diff {rel:.3g}")
    return out


def assert_same_bits(a: dict, b: dict, what: str = "parameters") -> None:
    diff = differences(a, b)
    assert not diff, f"{what} differ: {diff[:10]}"


def assert_runs_equal(npu: list[dict], cpu: list[dict], keys=("losses",)) -> None:
    """Every rank's listed record entries and parameters bitwise equal between the two runs."""
    for rn, rc in zip(npu, cpu):
        for k in keys:
            assert rn[k] == rc[k], f"rank {rn['rank']}: {k} npu {rn[k]} cpu {rc[k]}"
        if rc["params"] is not None:
            assert_same_bits(rn["params"], rc["params"], f"rank {rn['rank']} parameters")


def speed(npu: list[dict], cpu: list[dict]) -> str:
    """"s/step npu vs CPU" as the table in docs/torch.md gives it (rank 0's figures)."""
    return f"{npu[0]['s_per_step']:.3f} vs {cpu[0]['s_per_step']:.3f} s/step"
