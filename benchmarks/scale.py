"""Big worlds on one machine (#39): launch -> first collective -> exit, and memory, per world.

    python -m benchmarks.scale [--worlds 8,16,32,64] [--modes fork,fresh] [--json F] [--figures]
    python -m benchmarks.scale --ddp 2,3 [--json F] [--figures]

For each world and mode (``fork``: npurun's fork server, the default, also spelt ``on`` or
``1``; ``fresh``: NPUSIM_FORKSERVER=0, each rank a fresh interpreter, also ``off`` or ``0``), one
npurun job whose ranks initialise, run one 1 KiB AllReduce (its end is the "first collective"
time), time 20 more (the 1 KiB AllReduce time: median of rank 0's calls, each to its
completion), then wait at a file while this program reads every rank's RSS and PSS
(/proc/PID/smaps_rollup), and exit. Reported: seconds from starting npurun to the first
collective's end (the latest rank) and to npurun's exit without the timed calls and the pause
for reading memory (so: start, init, one AllReduce, destroy, exit); the AllReduce time; RSS and PSS per rank (mean) and
in all (PSS sums to the real total: shared pages are split among their users); and the cost per
added rank (the slope of launch -> exit between consecutive worlds).

``--ddp 2,3``: a torch DDP script (the DDP tutorial's ToyModel: two Linear layers, SGD, one
step) timed in-process from before ``init_process_group`` to after the first optimizer step,
on npusim's ``hccl`` backend under npurun and on ``gloo`` under torchrun (median of
``--repeat`` runs each; also each job's wall time from its launcher's start to its exit).

``--json F`` merges this run's rows into F (a row per world and mode, or per backend and world,
replaced when measured again: the worlds can be measured at different times); ``--figures``
writes the section "scale" of docs/figures.md from F's rows (``benchmarks.figures``).
A benchmark, not a test: the machine's other load shows in every figure (the load average is
printed and recorded).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {"fork": "fork", "on": "fork", "1": "fork", "fresh": "fresh", "off": "fresh", "0": "fresh"}

RANK = """
import json, os, time
def _cpu():
    t = os.times()
    return t.user + t.system
marks = [(time.time(), _cpu())]             # the script starts (forked, bootstrapped)
import numpy as np
import hccl, runtime
out = {out!r}
runtime.set_device(int(os.environ["LOCAL_RANK"]))
marks.append((time.time(), _cpu()))         # imported, device set
comm = hccl.init_comm()
marks.append((time.time(), _cpu()))         # communicator made
x = runtime.to_device(np.ones(256, np.float32))
comm.all_reduce(x)
runtime.synchronize()
first = time.time()
marks.append((first, _cpu()))               # first collective done
ts = []
for _ in range(20):
    t0 = time.perf_counter()
    comm.all_reduce(x)
    runtime.synchronize()
    ts.append(time.perf_counter() - t0)
r = comm.rank
marks.append((time.time(), _cpu()))         # the timed calls done
with open(os.path.join(out, f"r{{r}}.tmp"), "w") as f:
    json.dump({{"first": first, "pid": os.getpid(), "us": sorted(ts)[10] * 1e6,
               "loop": time.time() - first, "marks": marks}}, f)
os.replace(os.path.join(out, f"r{{r}}.tmp"), os.path.join(out, f"r{{r}}.json"))
go = os.path.join(out, "go")
deadline = time.time() + 600
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.05)
comm.destroy()
"""

DDP = """
import json, os, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
backend, out = sys.argv[1], sys.argv[2]
if backend == "hccl":
    import hccl.torch_backend  # noqa: F401  (torch_npu: import torch_npu)


class ToyModel(nn.Module):      # pytorch/tutorials, "Getting Started with DDP", basic demo
    def __init__(self):
        super().__init__()
        self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


t0 = time.perf_counter()
dist.init_process_group(backend)
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(ToyModel())
opt = torch.optim.SGD(model.parameters(), lr=0.001)
opt.zero_grad()
loss = nn.MSELoss()(model(torch.randn(20, 10)), torch.randn(20, 5))
loss.backward()
opt.step()
t1 = time.perf_counter()
dist.destroy_process_group()
with open(os.path.join(out, f"ddp{rank}.json"), "w") as f:
    json.dump({"seconds": t1 - t0, "param": float(next(model.parameters()).sum())}, f)
"""


def _mem(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _phases(t0: float, recs: list, total_cpu: float, npurun_cpu: float,
            server_cpu: float) -> dict:
    """Wall seconds from launch to each phase's end (the latest rank) and CPU seconds spent in
    each phase (summed over the ranks; npurun's process and the fork server apart)."""
    marks = [r["marks"] for r in recs]
    names = ("fork", "import", "init", "first", "loop")
    wall = {n: max(m[i][0] for m in marks) - t0 for i, n in enumerate(names)}
    cpu = {"fork": sum(m[0][1] for m in marks)}
    for i, n in enumerate(names[1:], 1):
        cpu[n] = sum(m[i][1] - m[i - 1][1] for m in marks)
    cpu["npurun"], cpu["server"] = npurun_cpu, server_cpu
    cpu["exit"] = total_cpu - sum(cpu.values())    # destroy, exit, npurun after the pause
    cpu["total"] = total_cpu
    return {"wall": {k: round(v, 2) for k, v in wall.items()},
            "cpu": {k: round(v, 2) for k, v in cpu.items()}}


def _env(**extra) -> dict:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run(world: int, mode: str, timeout: float) -> dict:
    out = tempfile.mkdtemp(prefix="npusim-scale-")
    script = os.path.join(out, "job.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(RANK.format(out=out)))
    env = _env(NPUSIM_FORKSERVER="1" if mode == "fork" else "0")
    cpu0 = _children_cpu()
    t0 = time.time()
    p = subprocess.Popen([sys.executable, "-m", "launcher", "--nproc-per-node", str(world),
                          script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    files = [os.path.join(out, f"r{r}.json") for r in range(world)]
    res = {"world": world, "mode": mode, "load": _load()}
    try:
        while not all(os.path.exists(f) for f in files):
            if p.poll() is not None or time.time() - t0 > timeout:
                res["error"] = f"npurun exited {p.poll()} or timed out: {p.stderr.read()[-800:]}"
                return res
            time.sleep(0.05)
        pause0 = time.time()
        recs = [json.load(open(f)) for f in files]
        mems = [_mem(r["pid"]) for r in recs]
        threads = sum(_threads(r["pid"]) for r in recs)
        ranks = {r["pid"] for r in recs}
        npurun_cpu = _cpu_of(p.pid)
        server_cpu = sum(_cpu_of(c) for c in _children(p.pid) if c not in ranks)
        open(os.path.join(out, "go"), "w").close()
        pause = time.time() - pause0
        p.communicate(timeout=timeout)
        loop = max(r["loop"] for r in recs)
        res.update(_phases(t0, recs, _children_cpu() - cpu0, npurun_cpu, server_cpu),
                   threads=threads, load_end=_load())
        res.update(first_s=max(r["first"] for r in recs) - t0,
                   exit_s=time.time() - t0 - pause - loop,
                   allreduce_us=recs[0]["us"], exitcode=p.returncode,
                   rss_mib=statistics.mean(m[0] for m in mems) / 2**20,
                   pss_mib=statistics.mean(m[1] for m in mems) / 2**20,
                   pss_total_gib=sum(m[1] for m in mems) / 2**30,
                   rss_total_gib=sum(m[0] for m in mems) / 2**30)
        return res
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        shutil.rmtree(out, ignore_errors=True)


def run_ddp(world: int, backend: str, timeout: float) -> dict:
    """One DDP job: the ranks' in-process seconds (the slowest rank) and the job's wall time."""
    out = tempfile.mkdtemp(prefix="npusim-ddp-")
    script = os.path.join(out, "ddp.py")
    with open(script, "w") as f:
        f.write(DDP)
    if backend == "hccl":
        cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--standalone"]   # a free port of its own
    t0 = time.time()
    try:
        p = subprocess.run([*cmd, script, backend, out], env=_env(), capture_output=True,
                           text=True, timeout=timeout)
        wall = time.time() - t0
        if p.returncode != 0:
            return {"error": f"exit {p.returncode}: {p.stderr[-600:]}"}
        recs = [json.load(open(os.path.join(out, f"ddp{r}.json"))) for r in range(world)]
        return {"in_process_s": max(r["seconds"] for r in recs), "wall_s": wall,
                "param": recs[0]["param"]}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def _merge(path: str | None, rows: list, key) -> list:
    """This run's rows merged into those saved in ``path`` (same key: the new one wins)."""
    old = []
    if path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    mine = {key(r) for r in rows}
    merged = [r for r in old if key(r) not in mine] + rows
    if path:
        with open(path, "w") as f:
            json.dump(merged, f, indent=1)
    return merged


def _key(r: dict):
    return ("ddp", r["backend"], r["world"]) if "backend" in r else ("world", r["world"],
                                                                     r["mode"])


def figures(rows: list) -> None:
    """Write the "scale" section of docs/figures.md from all saved rows."""
    from benchmarks.figures import write_section  # noqa: PLC0415
    worlds = sorted((r for r in rows if "backend" not in r and "error" not in r),
                    key=lambda r: (r["mode"] != "fork", r["world"]))
    head = ["world", "mode", "launch -> 1st collective (s)", "launch -> exit (s)",
            "1 KiB all_reduce (us)", "RSS / rank (MiB)", "PSS / rank (MiB)", "PSS total (GiB)",
            "load"]
    table = [[r["world"], "fork server" if r["mode"] == "fork" else "fresh interpreters",
              f"{r['first_s']:.1f}", f"{r['exit_s']:.1f}", f"{r['allreduce_us']:,.0f}",
              f"{r['rss_mib']:.0f}", f"{r['pss_mib']:.0f}", f"{r['pss_total_gib']:.2f}",
              r.get("load", "?")] for r in worlds]
    text = ["Launch -> exit: start, init, one AllReduce, destroy, exit (the 20 timed calls and "
            "the pause for reading memory left out); the 1 KiB AllReduce is timed to its "
            "completion (`runtime.synchronize()`). Before #39 (the issue's figures, idle "
            "machine, every rank importing everything): launch -> exit 10.6 s at world 16, "
            "44.8 s at 64, 102 s at 128; 53-64 MiB RSS per rank.", "", _slopes(worlds)]
    ddp = sorted((r for r in rows if "backend" in r), key=lambda r: (r["world"], r["backend"]))
    if ddp:
        text += ["", "A torch DDP script (the DDP tutorial's ToyModel, one SGD step): seconds "
                 "in-process from before `init_process_group` to after the first step (the "
                 "slowest rank; median of runs), and the job's wall time from the launcher's "
                 "start to its exit (npurun's fork server imports torch and torch._dynamo once "
                 "for the ranks: that time is in the hccl job's wall time, not in its ranks'):",
                 "",
                 "| world | backend (launcher) | init + first step (s) | launch -> exit (s) |"
                 " runs | load |", "|---|---|---|---|---|---|"]
        for r in ddp:
            who = "hccl (npurun)" if r["backend"] == "hccl" else "gloo (torchrun)"
            text.append(f"| {r['world']} | {who} | {r['in_process_s']:.2f} | {r['wall_s']:.1f}"
                        f" | {r['runs']} | {r.get('load', '?')} |")
    write_section("scale", "Big worlds on one machine: start-up, exit and memory per world",
                  "python -m benchmarks.scale --worlds 8,16,32,64,128,256 --modes fork "
                  "--phases --json F; python -m benchmarks.scale --ddp 2,3 --json F --figures",
                  head, table, "\n".join(text))


def _slopes(worlds: list) -> str:
    """The cost per added rank: the slope of launch -> exit between consecutive worlds."""
    parts = []
    for mode in ("fork", "fresh"):
        rs = [r for r in worlds if r["mode"] == mode]
        steps = [f"{a['world']}->{b['world']}: {(b['exit_s'] - a['exit_s']) / (b['world'] - a['world']) * 1000:.0f} ms"
                 for a, b in zip(rs, rs[1:])]
        if steps:
            parts.append(f"{'fork server' if mode == 'fork' else 'fresh interpreters'}: "
                         + ", ".join(steps))
    return ("Cost per added rank (launch -> exit, between consecutive worlds): "
            + "; ".join(parts) + ".") if parts else ""


def _fmt(d: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in d.items())


def _worlds(text: str, flag: str) -> list[int]:
    try:
        worlds = [int(w) for w in text.split(",")]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: comma-separated positive integers, e.g. 8,16") \
            from None
    if not worlds or min(worlds) < 1:
        raise SystemExit(f"{flag} {text!r}: every world must be >= 1")
    return worlds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="8,16,32,64")
    ap.add_argument("--modes", default="fork,fresh",
                    help="fork (or on, 1): the fork server; fresh (or off, 0): NPUSIM_FORKSERVER=0")
    ap.add_argument("--ddp", default=None, metavar="WORLDS",
                    help="time the DDP script at these worlds instead (hccl and gloo)")
    ap.add_argument("--repeat", type=int, default=3, help="DDP runs per backend and world")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default=None, help="merge the rows into this file")
    ap.add_argument("--phases", action="store_true",
                    help="also print, per job, the wall time to each phase's end and the CPU "
                         "seconds of each phase (ranks summed; npurun and the fork server apart)")
    ap.add_argument("--repeat-worlds", type=int, default=1, metavar="K",
                    help="run each world and mode K times (interleaved)")
    ap.add_argument("--figures", action="store_true",
                    help="write the 'scale' section of docs/figures.md from --json's rows")
    a = ap.parse_args(argv)
    bad = [m for m in a.modes.split(",") if m not in MODES]
    if bad:
        raise SystemExit(f"--modes {a.modes!r}: {', '.join(map(repr, bad))} is not one of "
                         f"{', '.join(MODES)} (fork/on/1: the fork server; fresh/off/0: "
                         "a fresh interpreter per rank)")
    if a.repeat < 1:
        raise SystemExit(f"--repeat must be >= 1, got {a.repeat}")
    if a.figures and not a.json:
        raise SystemExit("--figures needs --json FILE (the rows it renders)")
    rows = []
    print(f"# load average {_load()} at the start", flush=True)
    if a.ddp:
        print("| world | backend | init + first step (s) | launch -> exit (s) | runs |",
              flush=True)
        for world in _worlds(a.ddp, "--ddp"):
            for backend in ("hccl", "gloo"):
                got = [run_ddp(world, backend, a.timeout) for _ in range(a.repeat)]
                ok = [g for g in got if "error" not in g]
                if not ok:
                    print(f"| {world} | {backend} | failed: {got[0]['error']} |", flush=True)
                    continue
                row = {"world": world, "backend": backend, "runs": len(ok), "load": _load(),
                       "in_process_s": statistics.median(g["in_process_s"] for g in ok),
                       "wall_s": statistics.median(g["wall_s"] for g in ok)}
                rows.append(row)
                print(f"| {world} | {backend} | {row['in_process_s']:.2f} | "
                      f"{row['wall_s']:.1f} | {len(ok)} |", flush=True)
    else:
        print("| world | mode | launch->1st collective (s) | launch->exit (s) | 1 KiB all_reduce"
              " (us) | RSS/rank (MiB) | PSS/rank (MiB) | PSS total (GiB) |", flush=True)
        print("|---|---|---|---|---|---|---|---|", flush=True)
        for world in _worlds(a.worlds, "--worlds") * a.repeat_worlds:
            for mode in (MODES[m] for m in a.modes.split(",")):
                r = run(world, mode, a.timeout)
                if "error" in r:
                    print(f"| {world} | {mode} | failed: {r['error']} |", flush=True)
                    continue
                rows.append(r)
                print(f"| {world} | {mode} | {r['first_s']:.1f} | {r['exit_s']:.1f} | "
                      f"{r['allreduce_us']:,.0f} | {r['rss_mib']:.0f} | {r['pss_mib']:.0f} | "
                      f"{r['pss_total_gib']:.2f} |", flush=True)
                if a.phases:
                    print(f"#   load {r['load']} -> {r['load_end']}, {r['threads']} rank "
                          f"threads; wall to the end of: {_fmt(r['wall'])}; CPU s: "
                          f"{_fmt(r['cpu'])}", flush=True)
    print(f"# load average {_load()} at the end", flush=True)
    merged = _merge(a.json, rows, _key)
    if a.figures:
        figures(merged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
