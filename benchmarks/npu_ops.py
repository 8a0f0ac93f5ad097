"""Benchmark of npusim's torch npu device against CPU eager (a benchmark, not a timed test).

    PYTHONPATH=. python benchmarks/npu_ops.py [--rounds 7] [--steps 15] [--threads 1] [--figures]
                                              [--base DIR]

Prints microseconds per small operator on npu and on CPU eager, and one training step of a small
transformer (2 encoder layers, width 128, 4 heads, feed-forward 512, batch 8, sequence 64;
forward, backward, AdamW step) on npu and on CPU, with their ratios. ``--figures`` also writes
the section "npu-ops" of docs/figures.md. ``--base DIR`` first runs the same measurement on another
checkout of npusim (e.g. ``git archive`` of main into DIR) in a child process, and puts its npu
figures and ratios next to these ones: before and after from one run.

The machine is shared and its load moves: both devices are measured in the same process, one
after the other within each round (operators) or step (training), so a load change hits both, and
in the process's CPU time (``time.process_time``: every thread of the process, not the time other
processes hold the cores), with the wall-clock time of the steps next to it. An operator's figure
is the best round's mean (the least disturbed); a step's is the median over steps, and the ratio
is the median of the per-step ratios. torch runs one intra-op thread by
default (``--threads``): the npu device runs torch's CPU kernels too, so both sides compute the
same, and a second thread on a loaded 2-core machine only adds noise.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch_npu  # noqa: F401

F = torch.nn.functional


def operators(dev: str) -> dict:
    """name -> a call of one small operator on ``dev`` (64 x 64 float32 unless said)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=g).to(dev)
    b = torch.randn(64, 64, generator=g).to(dev)
    v = torch.randn(1000, generator=g).to(dev)
    i = torch.randint(0, 64, (32,), generator=g).to(dev)
    return {
        "add (a + b)": lambda: a + b,
        "add 1000 elements": lambda: v + v,
        "mul_ in place": lambda: a.mul_(1.0),
        "sum": lambda: a.sum(),
        "matmul": lambda: a @ b,
        "relu": lambda: torch.relu(a),
        "softmax": lambda: a.softmax(-1),
        "layer_norm": lambda: F.layer_norm(a, (64,)),
        "cat of two": lambda: torch.cat([a, b]),
        "index a[i]": lambda: a[i],
        "view (reshape)": lambda: a.view(4096),
        "empty": lambda: torch.empty(64, 64, device=dev),
    }


def per_op(rounds: int, n: int) -> dict:
    """name -> (cpu us, npu us): the best round's mean of ``n`` calls."""
    ops = {d: operators(d) for d in ("cpu", "npu")}
    best = {(d, k): float("inf") for d in ops for k in ops[d]}
    for _ in range(rounds):
        for k in ops["cpu"]:
            for d in ("cpu", "npu"):
                f = ops[d][k]
                for _ in range(20):
                    f()
                t = time.process_time()
                for _ in range(n):
                    f()
                if d == "npu":
                    torch.npu.synchronize()
                best[d, k] = min(best[d, k], (time.process_time() - t) / n * 1e6)
    return {k: (best["cpu", k], best["npu", k]) for k in ops["cpu"]}


def model():
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


class Trainer:
    def __init__(self, dev: str):
        torch.manual_seed(0)
        self.m = model().to(dev)
        self.opt = torch.optim.AdamW(self.m.parameters(), lr=1e-3)
        self.x = torch.randn(8, 64, 128, generator=torch.Generator().manual_seed(1)).to(dev)

    def step(self) -> tuple:
        """One step's (CPU ms, wall ms): forward, backward, AdamW step, the loss read back."""
        t, w = time.process_time(), time.perf_counter()
        loss = self.m(self.x).square().mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.last = loss.item()
        return (time.process_time() - t) * 1e3, (time.perf_counter() - w) * 1e3


def training(steps: int) -> dict:
    cpu, npu = Trainer("cpu"), Trainer("npu")
    for _ in range(3):
        cpu.step()
        npu.step()
    c, n = [], []
    for _ in range(steps):
        c.append(cpu.step())
        n.append(npu.step())
    out = {"same_loss": cpu.last == npu.last}
    for k, name in enumerate(("", "wall_")):
        cs, ns = [x[k] for x in c], [x[k] for x in n]
        out[name + "cpu_ms"], out[name + "npu_ms"] = statistics.median(cs), statistics.median(ns)
        out[name + "ratio"] = statistics.median(b / a for a, b in zip(cs, ns))
    return out


def base_run(base: str, args) -> dict:
    """The same measurement on the npusim checkout at ``base`` (its runtime and torch_npu), in a
    child process: {"ops": {name: [cpu, npu]}, "step": {...}}."""
    import json
    import os
    import subprocess
    import sys
    cmd = [sys.executable, os.path.abspath(__file__), "--json", "--rounds", str(args.rounds),
           "--calls", str(args.calls), "--steps", str(args.steps), "--threads", str(args.threads)]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(base))
    out = subprocess.run(cmd, cwd=base, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"the run on {base} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--figures", action="store_true", help="write docs/figures.md's section")
    ap.add_argument("--base", help="an npusim checkout to measure first, for a before column")
    ap.add_argument("--base-label", default="the base checkout",
                    help="how the figures page names --base (e.g. main's commit)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    base = base_run(args.base, args) if args.base else None
    ops = per_op(args.rounds, args.calls)
    step = training(args.steps)
    if args.json:
        import json
        print(json.dumps({"ops": ops, "step": step}))
        return
    rows = [[k, f"{c:.1f}", f"{n:.1f}", f"{n / c:.1f}x"] for k, (c, n) in ops.items()]
    rows.append(["training step (ms)", f"{step['cpu_ms']:.1f}", f"{step['npu_ms']:.1f}",
                 f"{step['ratio']:.2f}x"])
    rows.append(["training step, wall clock (ms)", f"{step['wall_cpu_ms']:.1f}",
                 f"{step['wall_npu_ms']:.1f}", f"{step['wall_ratio']:.2f}x"])
    head = ["operator", "CPU eager", "npu", "npu / CPU"]
    if base:
        head += ["before: CPU eager", "before: npu", "before: npu / CPU"]
        bs = base["step"]
        for r, (c, n) in zip(rows, base["ops"].values()):
            r += [f"{c:.1f}", f"{n:.1f}", f"{n / c:.1f}x"]
        rows[-2] += [f"{bs['cpu_ms']:.1f}", f"{bs['npu_ms']:.1f}", f"{bs['ratio']:.2f}x"]
        rows[-1] += [f"{bs['wall_cpu_ms']:.1f}", f"{bs['wall_npu_ms']:.1f}",
                     f"{bs['wall_ratio']:.2f}x"]
    print(" | ".join(head))
    for r in rows:
        print(f"{r[0]:<30} " + " ".join(f"{c:>9}" for c in r[1:]))
    print(f"training step: median ratio {step['ratio']:.2f}x in CPU time, "
          f"{step['wall_ratio']:.2f}x in wall-clock time (goal <= 2x)"
          + (f"; before: {base['step']['ratio']:.2f}x, {base['step']['wall_ratio']:.2f}x"
             if base else ""))
    with open("/proc/loadavg") as f:
        load1 = " ".join(f.read().split()[:3])
    print(f"load average: {load0} at the start, {load1} at the end; torch threads {args.threads}")
    if args.figures:
        from benchmarks.figures import write_section
        text = (
            "The torch `npu` device (runtime/torch/) against CPU eager, in one process: each "
            "operator on 64 x 64 float32 tensors unless named (microseconds of the process's "
            f"CPU time per call, the best of {args.rounds} interleaved rounds of {args.calls} "
            "calls), and one training step of a small transformer (2 encoder layers, width 128, "
            "4 heads, feed-forward 512, batch 8, sequence 64: forward, backward, AdamW step, "
            "loss read back; milliseconds of CPU time and of wall-clock time, medians of "
            f"{args.steps} alternating steps; the ratio is the median per-step ratio). CPU time "
            "is what the device costs; the wall clock also holds the waits for the cores of a "
            "machine other processes load. Goal of the step: at most 2x. "
            f"torch intra-op threads: {args.threads}; load average {load0} at the start. An npu "
            "operator is torch's CPU kernel on views of the device memory plus the device's "
            "Python: one boxed fallback, the pool's allocation for each result "
            "(docs/torch.md). "
            + (f"The *before* columns are the same measurement, in a child process just before, "
               f"of npusim at {args.base_label}. " if base else "")
            + ("The two steps' losses are equal, bitwise." if step["same_loss"] else
               "The losses differ in the last bits: torch's scaled_dot_product_attention takes its "
               "fused kernel on CPU and its math path on a new backend (docs/torch.md, limits)."))
        path = write_section("npu-ops", "The torch npu device against CPU eager",
                             "PYTHONPATH=. python benchmarks/npu_ops.py --figures"
                             + (f" --base DIR (DIR: {args.base_label})" if base else ""),
                             head, rows, text)
        print("wrote", path)


if __name__ == "__main__":
    main()
