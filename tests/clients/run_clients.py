"""Public clients on simulated NPUs vs the same scripts on CPU + gloo (tests/clients/SOURCES.md).

    PYTHONPATH=$PWD python tests/clients/run_clients.py [--world 2] [--client NAME ...]

Each client is a vendored public script, byte for byte. It runs twice per world size:

- **npu**: ``npurun --nproc-per-node W`` on npusim's simulated NPUs. A CUDA script gets the one
  documented edit, ``from torch_npu.contrib import transfer_to_npu`` on the line after its
  ``import torch`` (``npu_variant`` writes that copy; SOURCES.md shows the diff); a script
  written for any accelerator (``torch.accelerator``) can get ``import torch_npu`` there
  instead ("ddp-example-import"); a torch_npu script would run as it is.
- **ref**: ``python -m torch.distributed.run --standalone --nproc-per-node W`` (torchrun) on CPU
  tensors with gloo: the vendored file itself, with ref_shim mapping cuda/accelerator/npu to CPU
  and nccl/hccl to gloo for this run only.

Both go through client_runner.py, which seeds torch with 1234 + RANK (the clients seed nothing),
records the losses (every scalar ``backward()``) and the final parameters and buffers of every
DDP-wrapped module, and any checkpoint the client wrote. ``compare`` asserts they are equal
bit for bit, rank by rank. Both runs get OMP_NUM_THREADS=1 (torchrun's default for W > 1).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUNNER = os.path.join(HERE, "client_runner.py")
EDIT = "from torch_npu.contrib import transfer_to_npu"
IMPORT = "import torch_npu"       # torch_npu's own one line, for a script written for any accelerator

# name -> where the vendored script lives, what it runs, the edit it gets, what else to record.
# "runs": the script's argument lists, run one after the other in one working directory (the
# tutorial's second run resumes from the snapshot the first one saved).
CLIENTS = {
    "ddp-example": dict(
        dir="pytorch_examples/distributed/ddp", script="example.py", edit=EDIT,
        runs=[[]], collect=[]),
    "ddp-example-import": dict(
        dir="pytorch_examples/distributed/ddp", script="example.py", edit=IMPORT,
        runs=[[]], collect=[]),
    "ddp-tutorial": dict(
        dir="pytorch_examples/distributed/ddp-tutorial-series", script="multigpu_torchrun.py",
        edit=EDIT, runs=[["2", "1", "--batch_size", "32"]], collect=["snapshot.pt"]),
    "ddp-tutorial-resume": dict(
        dir="pytorch_examples/distributed/ddp-tutorial-series", script="multigpu_torchrun.py",
        edit=EDIT, runs=[["1", "1", "--batch_size", "64"], ["2", "1", "--batch_size", "64"]],
        collect=["snapshot.pt"]),
}


def npu_variant(text: str, line: str = EDIT) -> str:
    """``text`` with ``line`` inserted after its first ``import torch`` line: the one edit."""
    lines = text.splitlines(keepends=True)
    for i, ln in enumerate(lines):
        if ln.rstrip("\r\n") == "import torch":
            eol = ln[len(ln.rstrip("\r\n")):] or "\n"
            return "".join(lines[:i + 1] + [line + eol] + lines[i + 1:])
    raise ValueError("no 'import torch' line to put the transfer_to_npu line after")


def prepare(name: str, mode: str, work: str) -> str:
    """Copy client ``name`` into ``work``/src; for the npu run, apply its edit. Its script path."""
    c = CLIENTS[name]
    src = os.path.join(work, "src")
    shutil.copytree(os.path.join(HERE, c["dir"]), src)
    script = os.path.join(src, c["script"])
    if mode == "npu" and c["edit"]:
        with open(script, encoding="utf-8", newline="") as f:
            text = f.read()
        with open(script, "w", encoding="utf-8", newline="") as f:
            f.write(npu_variant(text, c["edit"]))
    return script


def command(mode: str, world: int, script: str, out: str, args: list[str],
            collect: list[str]) -> list[str]:
    launch = ([sys.executable, "-m", "launcher", "--nproc-per-node", str(world)] if mode == "npu"
              else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(world)])
    extra = [x for c in collect for x in ("--collect", c)]
    return [*launch, RUNNER, "--mode", mode, "--out", out, *extra, script, "--", *args]


def environment(base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ROOT not in parts:
        parts.insert(0, ROOT)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("NPUSIM_TORCH_NPU", None)
    return env


class ClientRun:
    """One client, one mode, one world: its per-run, per-rank records and wall times."""

    def __init__(self, name, mode, world, records, seconds, outputs):
        self.name, self.mode, self.world = name, mode, world
        self.records = records      # [run][rank] -> {"losses", "state", "files"}
        self.seconds = seconds      # [run] wall seconds, launcher start to exit
        self.outputs = outputs      # [run] (stdout, stderr)


def run(name: str, mode: str, world: int, work: str, env: dict | None = None,
        timeout: float = 300) -> ClientRun:
    """Run client ``name`` in ``mode`` ('npu' or 'ref') at ``world`` ranks under ``work``."""
    import torch
    c = CLIENTS[name]
    os.makedirs(work, exist_ok=True)
    script = prepare(name, mode, work)
    cwd = os.path.join(work, "cwd")
    os.makedirs(cwd)
    records, seconds, outputs = [], [], []
    for i, args in enumerate(c["runs"]):
        out = os.path.join(work, f"out{i}")
        cmd = command(mode, world, script, out, args, c["collect"])
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=cwd, env=environment(env), capture_output=True, text=True,
                           timeout=timeout)
        seconds.append(time.perf_counter() - t0)
        outputs.append((p.stdout, p.stderr))
        if p.returncode != 0:
            raise RuntimeError(f"{name} ({mode}, world {world}, run {i}: {' '.join(args)}) "
                               f"exited {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n"
                               f"--- stderr\n{p.stderr[-6000:]}")
        records.append([torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False)
                        for r in range(world)])
    return ClientRun(name, mode, world, records, seconds, outputs)


def _bits(t) -> bytes:
    import torch
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _same(a, b, where: str, diffs: list[str]) -> None:
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            diffs.append(f"{where}: {type(a).__name__} vs {type(b).__name__}")
        elif a.dtype != b.dtype or a.shape != b.shape:
            diffs.append(f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
        elif _bits(a) != _bits(b):
            d = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "-"
            diffs.append(f"{where}: values differ (max |diff| {d})")
    elif isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            diffs.append(f"{where}: keys {sorted(a)} vs {sorted(b)}")
        for k in a.keys() & b.keys():
            _same(a[k], b[k], f"{where}.{k}", diffs)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            diffs.append(f"{where}: {len(a)} items vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]", diffs)
    elif a != b:
        diffs.append(f"{where}: {a!r} vs {b!r}")


def compare(npu: ClientRun, ref: ClientRun) -> list[str]:
    """Every difference between the two runs' records (empty: bitwise equal everywhere)."""
    diffs: list[str] = []
    _same(npu.records, ref.records, "run", diffs)
    return diffs


def summary(rec_runs) -> str:
    """Steps and the first/last loss of rank 0, from one ClientRun's records."""
    losses = [float(x) for run_ in rec_runs for x in run_[0]["losses"]]
    if not losses:
        return "no losses"
    return f"{len(losses)} losses, first {losses[0]:.6g}, last {losses[-1]:.6g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, action="append", help="world size (repeatable; 2)")
    p.add_argument("--client", action="append", choices=sorted(CLIENTS), help="(all)")
    p.add_argument("--keep", action="store_true", help="keep the working directories")
    a = p.parse_args(argv)
    worlds = a.world or [2]
    failed = 0
    base = tempfile.mkdtemp(prefix="npusim-clients-")
    try:
        for name in a.client or list(CLIENTS):
            for w in worlds:
                runs = {m: run(name, m, w, os.path.join(base, f"{name}-{m}-{w}"))
                        for m in ("ref", "npu")}
                diffs = compare(runs["npu"], runs["ref"])
                failed += bool(diffs)
                tn, tr = sum(runs["npu"].seconds), sum(runs["ref"].seconds)
                print(f"{name:20s} world {w}: {'EQUAL (bitwise)' if not diffs else 'DIFFER'}; "
                      f"{summary(runs['npu'].records)}; npu {tn:.1f} s, cpu+gloo {tr:.1f} s "
                      f"(ratio {tn / tr:.2f})", flush=True)
                for d in diffs[:20]:
                    print("   ", d)
    finally:
        if a.keep:
            print("kept", base)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
