"""A training step of small work, eager against a replayed task graph:
``npurun --nproc-per-node 2 -m benchmarks.graph_step [--allreduces 8] [--bytes 1024]``, or
``python -m benchmarks.graph_step --worlds 2 [--base DIR] [--jobs 3] [--figures]`` for a table.

The step is one kernel and ``--allreduces`` AllReduces (MAX, so values stay put) of ``--bytes``
each on one stream, then a synchronize. Eager issues every call; a graph captures the step once
and replays it, with its adjacent AllReduces fused into one exchange (the default) and without
(``runtime.Graph(fuse=False)``). The three run in ``--rounds`` interleaved rounds of ``--steps``
steps each (eager, replay, fused replay, again and again: a machine whose speed drifts, as this
shared one's does from second to second, moves all three alike); each round's figure is the
median step, each ratio is taken within its round, and the run reports the medians over
rounds, with the results checked equal.

``--worlds`` runs npurun once per world and job (``--jobs``) and prints the medians over jobs;
with ``--base DIR`` another checkout (e.g. ``git worktree add --detach DIR COMMIT``) runs just
before this one in every job, as *before*: this very file measures both, with the other
checkout first on PYTHONPATH. ``--figures`` puts the table on docs/figures.md (section
graph-step).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import hccl
import runtime


def _axpy(x, y):
    x += y


def median_us(fn, calls: int, warmup: int, *args) -> float:
    """The median time of ``fn(*args)`` in microseconds over ``calls`` calls after ``warmup``."""
    for _ in range(warmup):
        fn(*args)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


KINDS = ("eager", "replay", "fused_replay")


def measure(comm, s, allreduces: int, nbytes: int, steps: int, warmup: int,
            rounds: int = 1) -> dict:
    """Median step times (us) of the step eager, replayed unfused and replayed fused, over
    ``rounds`` interleaved rounds of ``steps`` steps (each round's median step; the medians
    over rounds), the per-round ratios eager / replay (``*_x``, their medians) and whether
    every result is right. Collective: every rank of ``comm`` calls it."""
    n = max(1, nbytes // 4)
    w = runtime.to_device(np.ones(n, np.float32))
    grads = [runtime.to_device(np.full(n, 1.0 / comm.size, np.float32))
             for _ in range(allreduces)]

    def issue():
        runtime.launch(_axpy, w, grads[0], stream=s)
        for g in grads:
            comm.all_reduce(g, op=hccl.ReduceOp.MAX, stream=s)

    graphs = {}
    for fuse, key in ((False, "replay"), (True, "fused_replay")):
        graph = graphs[key] = runtime.Graph("step", fuse=fuse)
        with runtime.graph(graph, stream=s):
            issue()

    def step(kind):
        if kind == "eager":
            issue()
        else:
            graphs[kind].replay(s)
        s.synchronize()

    for kind in KINDS:                      # warm-up: every path bound, every pair made
        for _ in range(warmup):
            step(kind)
    got = {k: [] for k in KINDS}
    for _ in range(max(1, rounds)):
        for kind in KINDS:
            comm.barrier(stream=s)          # every rank starts the block together
            s.synchronize()
            got[kind].append(median_us(step, steps, 0, kind))
    out = {f"{k}_us": statistics.median(v) for k, v in got.items()}
    out["rounds"] = {f"{k}_us": v for k, v in got.items()}
    for k in KINDS[1:]:
        out[f"{k}_x"] = statistics.median(e / r for e, r in zip(got["eager"], got[k]))
    comm.barrier(stream=s)
    s.synchronize()
    # a MAX of equal values keeps them: the graphs' AllReduces computed what eager's did
    out["ok"] = all(np.allclose(g.to_host(), 1.0 / comm.size) for g in grads)
    return out


def _commit(checkout: str) -> str:
    p = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else "?"


def _run(side: str | None, world: int, args) -> dict:
    """One npurun of this benchmark at ``world``; ``side``: another checkout whose runtime and
    hccl it measures (this very file runs, by its path), None for this one."""
    env = None if side is None else dict(os.environ, PYTHONPATH=side)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "step.json")
        cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world)]
        cmd += ["-m", "benchmarks.graph_step"] if side is None else [os.path.abspath(__file__)]
        cmd += ["--allreduces", str(args.allreduces), "--bytes", str(args.bytes), "--steps",
                str(args.steps), "--rounds", str(args.rounds), "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=side)
        with open(out) as f:
            return json.load(f)


def table(args) -> int:
    worlds = [int(w) for w in args.worlds.split(",")]
    sides = [("after", None)] if args.base is None else [
        ("before", os.path.abspath(args.base)), ("after", None)]
    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    got: dict = {}
    for _ in range(args.jobs):
        for w in worlds:
            for name, side in sides:
                r = _run(side, w, args)
                cell = got.setdefault((w, name), {})
                for k, v in r.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        cell.setdefault(k, []).append(v)
                cell.setdefault("ok", []).append(r["ok"])
    head = ["world", "side", "eager us", "replay us", "fused replay us", "eager / replay",
            "eager / fused replay", "results"]
    rows = []
    for w in worlds:
        for name, _ in sides:
            c = got[(w, name)]
            m = {k: statistics.median(v) for k, v in c.items() if k != "ok"}
            rows.append([w, name, f"{m['eager_us']:.0f}", f"{m['replay_us']:.0f}",
                         f"{m['fused_replay_us']:.0f}", f"{m['replay_x']:.2f}x",
                         f"{m['fused_replay_x']:.2f}x",
                         "equal" if all(c["ok"]) else "DIFFER"])
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    if args.figures:
        from benchmarks import figures as page
        cmd = (f"python -m benchmarks.graph_step --worlds {args.worlds} --jobs {args.jobs} "
               f"--rounds {args.rounds} --steps {args.steps} --figures"
               + (" --base BEFORE" if args.base else ""))
        text = (f"A step of 1 kernel and {args.allreduces} AllReduces of {args.bytes} B on one "
                f"stream + synchronize (rank 0): eager, a task graph of it replayed, and the "
                f"graph with its AllReduces fused into one exchange, in {args.rounds} "
                f"interleaved rounds of {args.steps} steps per job; each cell the median over "
                f"{args.jobs} job(s) of the median over rounds of each round's median step; "
                f"the ratios are taken within each round (same seconds), then the medians. "
                f"Load average {load0} at the start of the run (the machine is shared: "
                f"compare ratios, not microseconds across runs; under load every exchange "
                f"waits for cores, so eager's eight exchanges suffer most)."
                + (f" *before*: the checkout BEFORE (commit `{_commit(args.base)}`), run just "
                   f"before *after* in every job." if args.base else ""))
        page.write_section("graph-step", "A step of small work: eager against graph replay",
                           cmd, head, rows, text)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allreduces", type=int, default=8)
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100, help="steps per round and kind")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--json", help="rank 0 writes the figures here")
    ap.add_argument("--worlds", help="e.g. 2,4: run npurun per world and job, one table")
    ap.add_argument("--jobs", type=int, default=3, help="with --worlds: jobs per world")
    ap.add_argument("--base", help="with --worlds: another checkout, run before this one in "
                    "every job, its figures as 'before'")
    ap.add_argument("--figures", action="store_true",
                    help="with --worlds: put the table on docs/figures.md (section graph-step)")
    args = ap.parse_args(argv)
    if args.worlds:
        return table(args)
    runtime.set_device()
    comm = hccl.init_comm()
    s = runtime.Stream()
    r = measure(comm, s, args.allreduces, args.bytes, args.steps, args.warmup, args.rounds)
    if comm.rank == 0:
        e, plain, fused = r["eager_us"], r["replay_us"], r["fused_replay_us"]
        print(f"world {comm.size}: a step of 1 kernel + {args.allreduces} x {args.bytes} B "
              f"all_reduce, medians of {args.rounds} interleaved rounds of {args.steps}: eager "
              f"{e:.0f} us, graph replay {plain:.0f} us ({r['replay_x']:.2f}x), fused graph "
              f"replay {fused:.0f} us ({r['fused_replay_x']:.2f}x); results "
              f"{'equal' if r['ok'] else 'DIFFER'}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=1)
    comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
