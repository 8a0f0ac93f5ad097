"""Benchmark of npusim's torch npu device against CPU eager (a benchmark, not a timed test).

    PYTHONPATH=. python benchmarks/npu_ops.py [--rounds 7] [--steps 15] [--threads 1] [--figures]
                                              [--base DIR] [--floor] [--libs] [--busy]

Prints microseconds per small operator on npu and on CPU eager, and one training step of a small
transformer (2 encoder layers, width 128, 4 heads, feed-forward 512, batch 8, sequence 64;
forward, backward, AdamW step) on npu and on CPU, with their ratios. ``--figures`` also writes
the section "npu-ops" of docs/figures.md. ``--base DIR`` first runs the same measurement on another
checkout of npusim (e.g. ``git archive`` of main into DIR) in a child process, and puts its npu
figures and ratios next to these ones: before and after from one run. ``--floor`` adds the
floor of a Python device (benchmarks/npu_floor.py, a child process) per operator and per operator
class; ``--libs`` a transformers Trainer step (tiny GPT-2) and a tiny Llama step; ``--busy`` the
same measurement again while another program (a Python spin loop it starts and kills) keeps one
core busy.

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

F = torch.nn.functional

# the operator class of each operator below (the floor's table is per class)
CLASS = {
    "add (a + b)": "elementwise", "add 1000 elements": "elementwise",
    "mul_ in place": "elementwise", "relu": "elementwise", "add out=": "elementwise",
    "sum": "reduction", "softmax": "reduction", "layer_norm": "reduction",
    "matmul": "matmul", "linear (bias)": "matmul",
    "view (reshape)": "view", "transpose": "view",
    "empty": "factory", "zeros": "factory",
    "cat of two": "other", "index a[i]": "other",
}


def operators(dev: str) -> dict:
    """name -> a call of one small operator on ``dev`` (64 x 64 float32 unless said)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=g).to(dev)
    b = torch.randn(64, 64, generator=g).to(dev)
    o = torch.empty(64, 64).to(dev)
    bias = torch.randn(64, generator=g).to(dev)
    v = torch.randn(1000, generator=g).to(dev)
    i = torch.randint(0, 64, (32,), generator=g).to(dev)
    return {
        "add (a + b)": lambda: a + b,
        "add 1000 elements": lambda: v + v,
        "mul_ in place": lambda: a.mul_(1.0),
        "add out=": lambda: torch.add(a, b, out=o),
        "relu": lambda: torch.relu(a),
        "sum": lambda: a.sum(),
        "softmax": lambda: a.softmax(-1),
        "layer_norm": lambda: F.layer_norm(a, (64,)),
        "matmul": lambda: a @ b,
        "linear (bias)": lambda: F.linear(a, b, bias),
        "view (reshape)": lambda: a.view(4096),
        "transpose": lambda: a.t(),
        "empty": lambda: torch.empty(64, 64, device=dev),
        "zeros": lambda: torch.zeros(64, 64, device=dev),
        "cat of two": lambda: torch.cat([a, b]),
        "index a[i]": lambda: a[i],
    }


def per_op(rounds: int, n: int, sync=None) -> dict:
    """name -> (cpu us, npu us): the best round's mean of ``n`` calls (``sync``: the npu
    device's synchronize, torch.npu's when None)."""
    sync = sync or torch.npu.synchronize
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
                    sync()
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


def intercepted(steps: int) -> dict:
    """The training step on CPU, plain and with every operator seen by an empty dispatch mode
    that only calls it (alternating): what Python's seeing each operator costs, with no device
    at all. {"cpu_ms", "mode_ms", "ratio" (median per-step), "ops" (per step)}."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Empty(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))
    plain, seen = Trainer("cpu"), Trainer("cpu")
    mode = Empty()
    for _ in range(3):
        plain.step()
        with mode:
            seen.step()
    mode.calls = 0
    a, b = [], []
    for _ in range(steps):
        a.append(plain.step()[0])
        with mode:
            b.append(seen.step()[0])
    return {"cpu_ms": statistics.median(a), "mode_ms": statistics.median(b),
            "ratio": statistics.median(y / x for x, y in zip(a, b)), "ops": mode.calls / steps}


def _llama(dev: str):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1)).to(dev)

    def step():
        t = time.process_time()
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        return (time.process_time() - t) * 1e3
    return step


def _trainer_steps(dev: str, steps: int) -> list:
    """CPU milliseconds of each step of transformers' Trainer on a tiny GPT-2 on ``dev``."""
    import tempfile
    from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                              TrainingArguments)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    ids = torch.randint(0, 64, (256, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": r, "labels": r} for r in ids]
    times: list = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.process_time()

        def on_step_end(self, *a, **k):
            times.append((time.process_time() - self.t) * 1e3)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, max_steps=steps + 3,
                                  per_device_train_batch_size=4, save_strategy="no",
                                  logging_strategy="no", report_to="none", disable_tqdm=True,
                                  use_cpu=dev == "cpu")
        tr = Trainer(model=GPT2LMHeadModel(cfg), args=targs, train_dataset=data,
                     callbacks=[Clock()])
        tr.train()
    assert str(next(tr.model.parameters()).device).startswith(dev), dev
    return times[3:]


def lib_steps(steps: int) -> dict:
    """A transformers Trainer step and a tiny Llama step, CPU and npu: their medians (ms)."""
    out = {}
    c, n = [], []
    for _ in range(2):            # alternating runs: a load change hits both devices
        c += _trainer_steps("cpu", steps)
        n += _trainer_steps("npu", steps)
    out["Trainer step, tiny GPT-2"] = {"cpu_ms": statistics.median(c),
                                       "npu_ms": statistics.median(n),
                                       "ratio": statistics.median(n) / statistics.median(c)}
    cs, ns = _llama("cpu"), _llama("npu")
    for _ in range(3):
        cs(), ns()
    c, n = [], []
    for _ in range(steps):
        c.append(cs())
        n.append(ns())
    out["tiny Llama step"] = {"cpu_ms": statistics.median(c), "npu_ms": statistics.median(n),
                              "ratio": statistics.median(b / a for a, b in zip(c, n))}
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
    if args.libs:
        cmd.append("--libs")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(base))
    out = subprocess.run(cmd, cwd=base, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"the run on {base} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def busy_run(args) -> dict:
    """The operators and the steps again while another program keeps one core busy (a Python
    spin loop, started here and killed after): {"rows": {row name: (cpu, npu, ratio text)}}."""
    import subprocess
    import sys
    spin = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        time.sleep(0.5)
        floor = floor_run(args) if args.floor else None
        ops = per_op(args.rounds, args.calls)
        step = training(args.steps)
        libs = lib_steps(args.steps) if args.libs else {}
    finally:
        spin.kill()
        spin.wait(timeout=30)
    rows = {k: (c, n, f"{n / c:.1f}x") for k, (c, n) in ops.items()}
    rows["training step (ms)"] = (step["cpu_ms"], step["npu_ms"], f"{step['ratio']:.2f}x")
    rows["training step, wall clock (ms)"] = (step["wall_cpu_ms"], step["wall_npu_ms"],
                                              f"{step['wall_ratio']:.2f}x")
    for name, st in libs.items():
        rows[f"{name} (ms)"] = (st["cpu_ms"], st["npu_ms"], f"{st['ratio']:.2f}x")
    return {"rows": rows, "step": step, "classes": by_class(ops, floor) if floor else []}


def floor_run(args) -> dict:
    """The floor of a Python device (benchmarks/npu_floor.py) in a child process (PrivateUse1 is
    renamed once per process): {name: [cpu us, floor us]}."""
    import json
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "npu_floor.py"), "--rounds", str(args.rounds),
           "--calls", str(args.calls), "--threads", str(args.threads), "--steps",
           str(args.steps)]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(here))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"the floor's run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])["ops"]


def geomean(xs) -> float:
    xs = list(xs)
    return statistics.geometric_mean(xs) if xs else float("nan")


def by_class(ops: dict, floor: dict) -> list:
    """Per operator class: geometric means of npu / CPU, floor / CPU and npu / floor."""
    rows = []
    for cls in dict.fromkeys(CLASS.values()):
        names = [k for k in ops if CLASS.get(k) == cls and k in floor]   # (not the step)
        if not names:
            continue
        rows.append([cls, ", ".join(names),
                     f"{geomean(ops[k][1] / ops[k][0] for k in names):.1f}x",
                     f"{geomean(floor[k][1] / floor[k][0] for k in names):.1f}x",
                     f"{geomean(ops[k][1] / floor[k][1] for k in names):.2f}x"])
    return rows


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
    ap.add_argument("--floor", action="store_true",
                    help="also measure the floor of a Python device (benchmarks/npu_floor.py)")
    ap.add_argument("--libs", action="store_true",
                    help="also a transformers Trainer step and a tiny Llama step")
    ap.add_argument("--busy", action="store_true",
                    help="measure again while another program keeps one core busy")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import torch_npu  # noqa: F401
    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    base = base_run(args.base, args) if args.base else None
    floor = floor_run(args) if args.floor else None
    ops = per_op(args.rounds, args.calls)
    step = training(args.steps)
    empty = intercepted(args.steps) if args.floor else None
    libs = lib_steps(args.steps) if args.libs else None
    busy = busy_run(args) if args.busy else None
    if args.json:
        import json
        print(json.dumps({"ops": ops, "step": step, "libs": libs}))
        return
    rows = [[k, f"{c:.1f}", f"{n:.1f}", f"{n / c:.1f}x"] for k, (c, n) in ops.items()]
    rows.append(["training step (ms)", f"{step['cpu_ms']:.1f}", f"{step['npu_ms']:.1f}",
                 f"{step['ratio']:.2f}x"])
    rows.append(["training step, wall clock (ms)", f"{step['wall_cpu_ms']:.1f}",
                 f"{step['wall_npu_ms']:.1f}", f"{step['wall_ratio']:.2f}x"])
    if empty:
        rows.append(["training step, CPU, every operator through an empty dispatch mode (ms)",
                     f"{empty['cpu_ms']:.1f}", f"{empty['mode_ms']:.1f}",
                     f"{empty['ratio']:.2f}x"])
    for name, st in (libs or {}).items():
        rows.append([f"{name} (ms)", f"{st['cpu_ms']:.1f}", f"{st['npu_ms']:.1f}",
                     f"{st['ratio']:.2f}x"])
    head = ["operator", "CPU eager", "npu", "npu / CPU"]
    if floor:
        head += ["floor", "floor / CPU", "npu / floor"]
        for r in rows:
            f = floor.get(r[0])
            if f is None:
                r += ["", "", ""]
                continue
            c, fl = f[:2]
            if len(f) > 2:      # the training step: the median of the per-step ratios
                r += [f"{fl:.1f}", f"{f[2]:.2f}x", f"{float(r[2]) / fl:.2f}x"]
            else:
                r += [f"{fl:.1f}", f"{fl / c:.1f}x", f"{ops[r[0]][1] / fl:.2f}x"]
    if busy:
        head += ["core busy: CPU eager", "core busy: npu", "core busy: npu / CPU"]
        for r in rows:
            got = busy["rows"].get(r[0])
            r += ["", "", ""] if got is None else [f"{got[0]:.1f}", f"{got[1]:.1f}", got[2]]
    if base:
        head += ["before: CPU eager", "before: npu", "before: npu / CPU"]
        bs = base["step"]
        bops = base["ops"]
        for r in rows:
            if r[0] in bops:
                c, n = bops[r[0]]
                r += [f"{c:.1f}", f"{n:.1f}", f"{n / c:.1f}x"]
            elif r[0] == "training step (ms)":
                r += [f"{bs['cpu_ms']:.1f}", f"{bs['npu_ms']:.1f}", f"{bs['ratio']:.2f}x"]
            elif r[0] == "training step, wall clock (ms)":
                r += [f"{bs['wall_cpu_ms']:.1f}", f"{bs['wall_npu_ms']:.1f}",
                      f"{bs['wall_ratio']:.2f}x"]
            elif r[0][:-len(" (ms)")] in (base.get("libs") or {}):
                st = base["libs"][r[0][:-len(" (ms)")]]
                r += [f"{st['cpu_ms']:.1f}", f"{st['npu_ms']:.1f}", f"{st['ratio']:.2f}x"]
            else:
                r += ["", "", ""]
    print(" | ".join(head))
    for r in rows:
        print(f"{r[0]:<30} " + " ".join(f"{c:>9}" for c in r[1:]))
    classes = by_class(ops, floor) if floor else []
    if classes:
        print("per class (geometric means): class | operators | npu / CPU | floor / CPU | "
              "npu / floor")
        for r in classes:
            print(" | ".join(r))
    if busy and busy["classes"]:
        print("per class, one core busy:")
        for r in busy["classes"]:
            print(" | ".join(r))
    if busy:
        print(f"one core busy: training step {busy['step']['ratio']:.2f}x in CPU time, "
              f"{busy['step']['wall_ratio']:.2f}x in wall-clock time")
    if empty:
        print(f"training step on CPU through an empty dispatch mode ({empty['ops']:.0f} "
              f"operators a step): {empty['ratio']:.2f}x CPU eager")
    print(f"training step: median ratio {step['ratio']:.2f}x in CPU time, "
          f"{step['wall_ratio']:.2f}x in wall-clock time (goal <= 1.1x)"
          + (f"; before: {base['step']['ratio']:.2f}x, {base['step']['wall_ratio']:.2f}x"
             if base else ""))
    with open("/proc/loadavg") as f:
        load1 = " ".join(f.read().split()[:3])
    print(f"load average: {load0} at the start, {load1} at the end; torch threads {args.threads}")
    if args.figures:
        write_figures(args, head, rows, classes, step, base, load0, libs, busy)


def write_figures(args, head, rows, classes, step, base, load0, libs, busy=None) -> None:
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
        "machine other processes load. Goals: `a + b` at most 5x CPU eager, the step at "
        f"most 1.1x. torch intra-op threads: {args.threads}; load average {load0} at the "
        "start. An npu operator is torch's CPU kernel on views of the device memory plus the "
        "device's Python: one boxed fallback, the pool's allocation for each result "
        "(docs/torch.md). "
        + ("The *floor* is the fewest Python calls a Python PrivateUse1 device can make per "
           "operator (benchmarks/npu_floor.py, in a child process: PrivateUse1 is renamed "
           "once per process): npusim's algorithm with the device taken out. Each result is "
           "`np.empty` of its dtype and shape exported through DLPack, its CPU tensor the "
           "view the kernel writes through; CPU views of npu tensors cached per storage; a "
           "functional structured operator (`add.Tensor`, `mm`, `_softmax`...) one Python "
           "kernel (meta metadata remembered per argument signature, the `out=` CPU kernel "
           "into the new result), any other operator one boxed fallback running torch's CPU "
           "kernel on the views. No pool, no statistics, no stream order, no device index, "
           "no memory checks, no profiler / sanitizer / graph switches. npu / floor is what "
           "the device's own work costs; its CPU eager column (same child) gives the floor "
           "its own ratio. The floor runs the training step too (same child, alternating "
           "with CPU eager; `scaled_dot_product_attention` takes the CPU's fused kernel as on "
           "npusim). The step's row *through an empty dispatch mode* has no device at all: "
           "CPU eager, each of the step's operators seen by a Python TorchDispatchMode that "
           "only calls it, against CPU eager alone (alternating, in the npu column): what "
           "Python's seeing each operator costs. " if classes else "")
        + ("The Trainer step is transformers' Trainer on a tiny GPT-2 (2 layers, width 32, "
           "batch 4, sequence 16; two alternating runs per device, the ratio of the medians), "
           "the Llama step a tiny LlamaForCausalLM (2 layers, width "
           "64, batch 4, sequence 32) with AdamW, each the median of its steps, CPU and npu "
           "one after the other. " if libs else "")
        + ("The *core busy* columns are the same measurement again while another program "
           "(`python -c 'while 1: pass'`, started by the benchmark and killed after) keeps "
           "one core busy. " if args.busy else "")
        + (f"The *before* columns are the same measurement, in a child process just before, "
           f"of npusim at {args.base_label}. " if base else "")
        + ("The two steps' losses are equal, bitwise." if step["same_loss"] else
           "The losses differ in the last bits: torch's scaled_dot_product_attention takes its "
           "fused kernel on CPU and its math path on a new backend (docs/torch.md, limits)."))
    if classes:
        text += ("\n\nPer operator class, geometric means over its operators: "
                 + "; ".join(f"{r[0]} ({r[1]}): npu {r[2]} CPU, floor {r[3]} CPU, "
                             f"npu / floor {r[4]}" for r in classes) + ".")
    if busy and busy["classes"]:
        text += ("\n\nThe same with one core busy: "
                 + "; ".join(f"{r[0]}: npu {r[2]} CPU, floor {r[3]} CPU, npu / floor {r[4]}"
                             for r in busy["classes"]) + ".")
    cmd = ("PYTHONPATH=. python benchmarks/npu_ops.py --figures"
           + (" --floor" if classes else "") + (" --libs" if libs else "")
           + (" --busy" if args.busy else "")
           + (f" --base DIR (DIR: {args.base_label})" if base else ""))
    path = write_section("npu-ops", "The torch npu device against CPU eager", cmd, head, rows,
                         text)
    print("wrote", path)


if __name__ == "__main__":
    main()
