"""The launch-policy table of #37: npurun's scheduling policies, on an idle and a shared machine.

    python -m benchmarks.launch_policy [--rounds 3] [--loads 0,1,2] [--world 4]

For each load (0, 1 or 2 other programs each keeping a core busy: ``python3 -c "while True:
pass"``, started here and killed by pid afterwards) and each round, every policy runs once, in
an order rotated per round (policies interleaved, so a change of the machine's background load
hits them all alike): ``npurun --nproc-per-node W -m hccl.bench --sizes 1K,64K --timing
median``. A cell is the median over rounds of the bench's 1 KiB / 64 KiB medians; the load
average is recorded per load. Policies (environment of npurun):

    default          nothing set: what npurun does by itself (since #37: nothing)
    both off         NPUSIM_BIND=0 NPUSIM_SCHED_BATCH=0 (the same as default: a noise gauge)
    bind only        NPUSIM_BIND=1 NPUSIM_SCHED_BATCH=0 (npurun's NPUSIM_SCHED_BATCH=0 before)
    batch only       NPUSIM_BIND=0 NPUSIM_SCHED_BATCH=1 (npurun's NPUSIM_BIND=0 before)
    batch+bind       NPUSIM_SCHED_BATCH=1 NPUSIM_BIND=1 (npurun's default before #37)

A benchmark, not a test: figures depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = {
    "default": {},
    "both off": {"NPUSIM_BIND": "0", "NPUSIM_SCHED_BATCH": "0"},
    "bind only": {"NPUSIM_BIND": "1", "NPUSIM_SCHED_BATCH": "0"},
    "batch only": {"NPUSIM_BIND": "0", "NPUSIM_SCHED_BATCH": "1"},
    "batch+bind": {"NPUSIM_SCHED_BATCH": "1", "NPUSIM_BIND": "1"},
}
SIZES = (1024, 65536)


def run_once(world: int, env_extra: dict, iters: int, timeout: float) -> dict[int, float]:
    """{bytes: median us} of one npurun job, or {} when it failed."""
    fd, path = tempfile.mkstemp(prefix="npusim-policy-", suffix=".json")
    os.close(fd)
    env = {k: v for k, v in os.environ.items() if k not in ("NPUSIM_BIND", "NPUSIM_SCHED_BATCH")}
    env.update(env_extra)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "-m", "hccl.bench",
           "--sizes", ",".join(str(s) for s in SIZES), "--timing", "median", "-n", str(iters),
           "-w", "20", "-c", "0", "--json", path]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            sys.stderr.write(f"launch_policy: {env_extra}: npurun exited {out.returncode}:\n"
                             f"{out.stderr[-2000:]}\n")
            return {}
        with open(path) as f:
            rows = json.load(f)["results"]
        return {r["bytes"]: r["time_us"] for r in rows}
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"launch_policy: {env_extra}: {e}\n")
        return {}
    finally:
        os.unlink(path)


def hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.launch_policy",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loads", default="0,1,2", help="busy-core counts to measure, e.g. 0,1")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", default=None, help="write every run's figures here")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.world < 1 or a.iters < 1:
        ap.error(f"--rounds, --world and --iters must be >= 1, got {a.rounds}, {a.world}, "
                 f"{a.iters}")
    names = [p.strip() for p in a.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        ap.error(f"--policies: unknown {unknown}; known: {', '.join(POLICIES)}")
    loads = [int(x) for x in a.loads.split(",")]
    runs: dict = {}
    loadavg: dict = {}
    for load in loads:
        busy = hogs(load)
        try:
            time.sleep(0.5)
            seen = []
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    seen.append(float(open("/proc/loadavg").read().split()[0]))
                    got = run_once(a.world, POLICIES[name], a.iters, 300)
                    runs.setdefault((load, name), []).append(got)
                    print(f"# load {load} round {r} {name:>10}: "
                          + "  ".join(f"{s // 1024} KiB {got.get(s, float('nan')):8.1f} us"
                                      for s in SIZES), flush=True)
            loadavg[load] = statistics.median(seen)
        finally:
            stop(busy)
    print(f"\nworld {a.world}, all_reduce, hccl.bench --timing median (us, median of "
          f"{a.rounds} interleaved rounds; 1 KiB / 64 KiB)\n")
    print("| machine | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for load in loads:
        cells = []
        for name in names:
            vals = []
            for s in SIZES:
                xs = [g[s] for g in runs[(load, name)] if s in g]
                vals.append(f"{statistics.median(xs):,.0f}" if xs else "failed")
            cells.append(" / ".join(vals))
        what = "idle-ish" if load == 0 else f"{load} core(s) busy"
        print(f"| {what} (loadavg {loadavg[load]:.1f}) | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{k[0]}|{k[1]}": v for k, v in runs.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
