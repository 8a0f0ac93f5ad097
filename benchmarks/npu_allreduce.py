"""all_reduce through the "hccl" torch backend on npu tensors vs CPU tensors (not a timed test).

    PYTHONPATH=. python benchmarks/npu_allreduce.py [--world 2] [--rounds 5] [--jobs N]
        [--base DIR] [--write]

Runs itself under npurun (``python -m launcher --nproc-per-node WORLD``); each rank binds its
NPU (``torch.npu.set_device(local_rank)``), then for 1 KiB, 1 MiB and 16 MiB of float32 times
``dist.all_reduce(t)`` until its result is there: on npu tensors the call then
``torch.npu.synchronize()`` (the call itself returns at once: stream-ordered), on CPU tensors the
call alone (it blocks until the completer copied the result back); and hccl's own eager call on
device memory of the same size and NPU (``comm.all_reduce`` + ``synchronize``), the goal's
yardstick. Rounds rotate the three, each after a barrier; a round's figure is its median call,
the table rank 0's median round, and npu / hccl eager the median of the per-round ratios.

Per call it also counts, after a warm-up call on the same tensor (so the communicator's bound
Call is found): the Python frames entered on the calling thread (``sys.setprofile``: every
Python function call, and those in hccl/; the completer and stream worker threads are not
counted) and the copies of the tensor's bytes (the staging buffers a call takes, new or kept
from the group's earlier calls (hccl/torch/work.py's ``Spares``), and
its copies into and out of them). ``--write`` puts the table on docs/figures.md
(section "npu-allreduce").
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (("1 KiB", 1 << 10, 400), ("1 MiB", 1 << 20, 40), ("16 MiB", 16 << 20, 6))


def _count_call(fn) -> int:
    """(Python frames entered, of which in hccl/) by ``fn()`` on this thread."""
    import hccl
    hccl_dir = os.path.dirname(os.path.abspath(hccl.__file__)) + os.sep    # the checkout run
    counts = [0, 0]

    def prof(frame, event, arg):
        if event == "call":
            counts[0] += 1
            if frame.f_code.co_filename.startswith(hccl_dir):
                counts[1] += 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return tuple(counts)


def rank_side(out: str, rounds: int) -> None:
    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401

    import hccl.torch_backend  # noqa: F401
    from hccl.torch import work as torch_work

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(1)
    torch.npu.set_device(local)
    dist.init_process_group("hccl")
    copies = {"buffers": 0, "in": 0, "out": 0}
    real = (torch_work.Staging.buffer, torch_work.put, torch_work.take)

    def buffer(self, count, dtype):
        copies["buffers"] += 1
        return real[0](self, count, dtype)

    def put(a, start, t):
        copies["in"] += 1
        return real[1](a, start, t)

    def take(a, start, t):
        copies["out"] += 1
        return real[2](a, start, t)
    # ops.py's StagedBody calls them as work.py's attributes; an older backend.py (a --base
    # checkout) imported them by name
    torch_work.Staging.buffer = buffer
    for m in (torch_work, sys.modules["hccl.torch.backend"]):
        if hasattr(m, "put"):
            m.put, m.take = put, take
    import numpy as np

    import runtime
    comm = dist.distributed_c10d._get_default_group().comm     # the group's communicator
    hs = runtime.Stream()
    rows = {}
    for label, nbytes, reps in SIZES:
        n = nbytes // 4
        tensors = {"npu": torch.ones(n, device="npu"), "cpu": torch.ones(n),
                   "hccl": runtime.to_device(np.ones(n, np.float32))}

        def once(dev):
            if dev == "hccl":                   # hccl's own eager call, same bytes, same NPU
                comm.all_reduce(tensors[dev], stream=hs)
                hs.synchronize()
                return
            dist.all_reduce(tensors[dev])
            if dev == "npu":
                torch.npu.synchronize()
        per = {"npu": [], "cpu": [], "hccl": []}
        orders = (("npu", "cpu", "hccl"), ("hccl", "npu", "cpu"), ("cpu", "hccl", "npu"))
        for r in range(rounds):
            for dev in orders[r % 3]:
                dist.barrier()
                once(dev)                                  # warm: the bound Call, the pool
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    once(dev)
                    times.append(time.perf_counter() - t0)
                per[dev].append(statistics.median(times) * 1e6)
        cost = {}
        for dev in ("npu", "cpu"):
            dist.barrier()
            once(dev)
            for k in copies:
                copies[k] = 0
            # the call alone (synchronize after: its frames are not the backend's)
            frames = _count_call(lambda: dist.all_reduce(tensors[dev]))
            if dev == "npu":
                torch.npu.synchronize()
            cost[dev] = {"frames": frames, **copies}
        rows[label] = {"us": {d: statistics.median(v) for d, v in per.items()}, "cost": cost,
                       "npu_hccl": statistics.median(a / b for a, b in zip(per["npu"],
                                                                          per["hccl"]))}
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def _commit(checkout: str) -> str:
    p = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else "?"


def _job(side: str, args) -> dict | None:
    """One npurun of the rank side with the checkout ``side`` first on PYTHONPATH (this very
    file runs, by its path); rank 0's rows, or None (printed why) if it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        # NPUSIM_TORCH_NPU=1: that checkout's torch_npu, not the one installed from another
        env = dict(os.environ, PYTHONPATH=side, NPUSIM_TORCH_NPU="1")
        cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(args.world),
               os.path.abspath(__file__), "--rounds", str(args.rounds), "--rank-side", out]
        res = subprocess.run(cmd, env=env, cwd=side, capture_output=True, text=True,
                             timeout=1200)
        if res.returncode != 0:
            print(res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr)
            return None
        with open(out) as f:
            return json.load(f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--write", action="store_true", help="write the docs/figures.md section")
    ap.add_argument("--jobs", type=int, default=1, help="npurun jobs (per side); medians")
    ap.add_argument("--base", help="another checkout, run before this one in every job, its "
                    "rows as 'before' (this very file measures both)")
    ap.add_argument("--rank-side", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_side:
        rank_side(args.rank_side, args.rounds)
        return 0
    if args.world < 2 or args.rounds < 1:
        ap.error("--world must be >= 2 and --rounds >= 1")
    sides = [("", ROOT)] if args.base is None else [("before", os.path.abspath(args.base)),
                                                      ("after", ROOT)]
    runs: dict = {}
    for _ in range(args.jobs):
        for name, side in sides:
            rows = _job(side, args)
            if rows is None:
                return 1
            runs.setdefault(name, []).append(rows)
    head = ["size", "npu us/call", "hccl eager us/call", "npu / hccl eager", "CPU us/call",
            "CPU / npu", "frames npu (hccl/)", "frames CPU (hccl/)", "copies npu", "copies CPU"]
    if args.base is not None:
        head.insert(1, "side")
    table = []
    for label, _, _ in SIZES:
        for name, _ in sides:
            got = [rows[label] for rows in runs[name]]
            us = {d: statistics.median(r["us"][d] for r in got) for d in ("npu", "hccl", "cpu")}
            ratio = statistics.median(r["npu_hccl"] for r in got)
            cost = got[-1]["cost"]

            def copies(c):
                return f"{c['in'] + c['out']} ({c['buffers']} staging buffers)"
            row = [label, f"{us['npu']:.0f}", f"{us['hccl']:.0f}", f"{ratio:.2f}",
                   f"{us['cpu']:.0f}", f"{us['cpu'] / us['npu']:.2f}",
                   f"{cost['npu']['frames'][0]} ({cost['npu']['frames'][1]})",
                   f"{cost['cpu']['frames'][0]} ({cost['cpu']['frames'][1]})",
                   copies(cost["npu"]), copies(cost["cpu"])]
            if args.base is not None:
                row.insert(1, name)
            table.append(row)
    print(" | ".join(head))
    for row in table:
        print(" | ".join(row))
    if args.write:
        if ROOT not in sys.path:            # run as a script without PYTHONPATH=.
            sys.path.insert(0, ROOT)
        from benchmarks import figures
        text = (f"World {args.world} under npurun, float32, rank 0's figures: the median of "
                f"{args.rounds} alternating rounds, each the median call (with --jobs, the "
                "median over jobs). npu: "
                "`dist.all_reduce(t)` then `torch.npu.synchronize()` (the call is stream-ordered and returns at once); "
                "CPU: `dist.all_reduce(t)` (blocks until the result is copied back); hccl "
                "eager: the group's communicator's own `comm.all_reduce(x, stream=s)` + "
                "`s.synchronize()` on device memory of the same NPU (npu / hccl eager: the "
                "median of the per-round ratios). Load average "
                f"{' '.join(open('/proc/loadavg').read().split()[:3])} at the end of the run. "
                "Frames: "
                "Python calls on the calling thread during one call after a warm-up "
                "(sys.setprofile; the completer and stream threads not counted), those in hccl/ "
                "in brackets. Copies: the backend's copies of the tensor's bytes into and out of "
                "staging buffers." + (f" *before*: the checkout BEFORE (commit "
                                      f"`{_commit(args.base)}`), run just before *after* in "
                                      "each job." if args.base else ""))
        figures.write_section("npu-allreduce", "all_reduce through the hccl backend: npu vs "
                              "CPU tensors", f"PYTHONPATH=. python benchmarks/npu_allreduce.py "
                              f"--world {args.world} --rounds {args.rounds} --jobs {args.jobs}"
                              + (" --base BEFORE" if args.base else "") + " --write",
                              head, table, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
