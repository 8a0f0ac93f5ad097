"""Big worlds on one machine (#39): launch -> first collective -> exit, and memory, per world.

    python -m benchmarks.scale [--worlds 8,16,32,64] [--modes fork,fresh]

For each world and mode (``fork``: npurun's fork server, the default; ``fresh``:
NPUSIM_FORKSERVER=0, each rank a fresh interpreter), one npurun job whose ranks initialise,
run one 1 KiB AllReduce (its end is the "first collective" time), time 20 more (the 1 KiB
AllReduce time: median of rank 0's calls), then wait at a file while this program reads every
rank's RSS and PSS (/proc/PID/smaps_rollup), and exit. Reported: seconds from starting npurun
to the first collective's end (the latest rank) and to npurun's exit, the AllReduce time, RSS and
PSS per rank (mean) and in all (PSS sums to the real total: shared pages are split among their
users). A benchmark, not a test: the machine's other load shows in every figure (the load
average is printed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK = """
import json, os, time
import numpy as np
import hccl, runtime
out = {out!r}
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
x = runtime.to_device(np.ones(256, np.float32))
comm.all_reduce(x)
first = time.time()
ts = []
for _ in range(20):
    t0 = time.perf_counter()
    comm.all_reduce(x)
    ts.append(time.perf_counter() - t0)
r = comm.rank
with open(os.path.join(out, f"r{{r}}.tmp"), "w") as f:
    json.dump({{"first": first, "pid": os.getpid(), "us": sorted(ts)[10] * 1e6}}, f)
os.replace(os.path.join(out, f"r{{r}}.tmp"), os.path.join(out, f"r{{r}}.json"))
go = os.path.join(out, "go")
deadline = time.time() + 300
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.05)
comm.destroy()
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


def run(world: int, mode: str, timeout: float) -> dict:
    out = tempfile.mkdtemp(prefix="npusim-scale-")
    script = os.path.join(out, "job.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(RANK.format(out=out)))
    env = dict(os.environ, NPUSIM_FORKSERVER="1" if mode == "fork" else "0")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.time()
    p = subprocess.Popen([sys.executable, "-m", "launcher", "--nproc-per-node", str(world),
                          script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    files = [os.path.join(out, f"r{r}.json") for r in range(world)]
    res = {"world": world, "mode": mode}
    try:
        while not all(os.path.exists(f) for f in files):
            if p.poll() is not None or time.time() - t0 > timeout:
                res["error"] = f"npurun exited {p.poll()} or timed out: {p.stderr.read()[-800:]}"
                return res
            time.sleep(0.05)
        recs = [json.load(open(f)) for f in files]
        mems = [_mem(r["pid"]) for r in recs]
        open(os.path.join(out, "go"), "w").close()
        p.wait(timeout)
        res.update(first_s=max(r["first"] for r in recs) - t0, exit_s=time.time() - t0,
                   allreduce_us=recs[0]["us"], exitcode=p.returncode,
                   rss_mib=statistics.mean(m[0] for m in mems) / 2**20,
                   pss_mib=statistics.mean(m[1] for m in mems) / 2**20,
                   pss_total_gib=sum(m[1] for m in mems) / 2**30,
                   rss_total_gib=sum(m[0] for m in mems) / 2**30)
        return res
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for name in os.listdir(out):
            os.unlink(os.path.join(out, name))
        os.rmdir(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="8,16,32,64")
    ap.add_argument("--modes", default="fork,fresh")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows = []
    print(f"# load average {open('/proc/loadavg').read().split()[0]} at the start", flush=True)
    print("| world | mode | launch->1st collective (s) | launch->exit (s) | 1 KiB all_reduce (us)"
          " | RSS/rank (MiB) | PSS/rank (MiB) | PSS total (GiB) |", flush=True)
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for world in (int(w) for w in a.worlds.split(",")):
        for mode in a.modes.split(","):
            r = run(world, mode, a.timeout)
            rows.append(r)
            if "error" in r:
                print(f"| {world} | {mode} | failed: {r['error']} |", flush=True)
                continue
            print(f"| {world} | {mode} | {r['first_s']:.1f} | {r['exit_s']:.1f} | "
                  f"{r['allreduce_us']:,.0f} | {r['rss_mib']:.0f} | {r['pss_mib']:.0f} | "
                  f"{r['pss_total_gib']:.2f} |", flush=True)
    print(f"# load average {open('/proc/loadavg').read().split()[0]} at the end", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
