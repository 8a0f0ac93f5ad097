"""What a rank holds for its connections at big worlds (#39): descriptors, sockets, threads, mapped
shared-memory inboxes and their pages, after init and a few collectives.

    python -m benchmarks.conns [--worlds 16,64,128] [--algos default,ring] [--write]

One npurun job per world and algorithm (HCCL_ALGO unset: a 1 KiB AllReduce is a star from world
3; ``ring``: every rank talks to its two neighbours). Each rank initialises (timed), runs a 1 KiB
and a 1 MiB AllReduce, then reads its own /proc: open descriptors, sockets among them, threads,
the hccl inboxes it maps (``npusim-*-hccl-r*``) and their proportional resident bytes (PSS: summed
over the ranks it is what the node's segments really hold), and its PSS in all. Printed: mean
and max per rank (the max is a star's root), the sum of segment bytes, and npurun's launch ->
exit seconds. ``--write`` puts the table into docs/figures.md (section "connections"). A
benchmark, not a test: the machine's load shows in the seconds (it is printed).
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
t0 = time.time()
import numpy as np
import hccl, runtime
runtime.set_device(int(os.environ["LOCAL_RANK"]))
t1 = time.time()
comm = hccl.init_comm()
t2 = time.time()
for n in (256, 1 << 18):
    x = runtime.to_device(np.ones(n, np.float32))
    comm.all_reduce(x)
runtime.synchronize()
fds = os.listdir("/proc/self/fd")
socks = 0
for fd in fds:
    try:
        socks += os.readlink(f"/proc/self/fd/{{fd}}").startswith("socket:")
    except OSError:
        pass
maps, seg_pss, cur = set(), 0, None
with open("/proc/self/smaps") as f:
    for line in f:
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:
            cur = parts[5] if len(parts) > 5 and "-hccl-r" in parts[5] else None
            if cur:
                maps.add(cur)
        elif cur and parts[0] == "Pss:":
            seg_pss += int(parts[1]) * 1024
pss = 0
with open("/proc/self/smaps_rollup") as f:
    for line in f:
        if line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
res = {{"init_s": t2 - t1, "fds": len(fds), "sockets": socks,
        "threads": len(os.listdir("/proc/self/task")), "inboxes": len(maps),
        "seg_pss": seg_pss, "pss": pss}}
with open(os.path.join({out!r}, f"r{{comm.rank}}.json"), "w") as f:
    json.dump(res, f)
comm.destroy()
"""


def run(world: int, algo: str, timeout: float) -> dict:
    out = tempfile.mkdtemp(prefix="npusim-conns-")
    script = os.path.join(out, "job.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(RANK.format(out=out)))
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("HCCL_ALGO", None)
    if algo != "default":
        env["HCCL_ALGO"] = algo
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "launcher", "--nproc-per-node", str(world),
                            script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=timeout)
        exit_s = time.time() - t0
        recs = []
        for r in range(world):
            path = os.path.join(out, f"r{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    recs.append(json.load(f))
        if p.returncode != 0 or len(recs) != world:
            return {"world": world, "algo": algo,
                    "error": f"npurun exited {p.returncode}, {len(recs)} of {world} ranks "
                             f"reported: {p.stderr[-600:]}"}
    except subprocess.TimeoutExpired:
        return {"world": world, "algo": algo, "error": f"no exit within {timeout:g} s"}
    finally:
        for name in os.listdir(out):
            os.unlink(os.path.join(out, name))
        os.rmdir(out)

    def mm(k):
        return statistics.mean(r[k] for r in recs), max(r[k] for r in recs)
    return {"world": world, "algo": algo, "exit_s": exit_s, "init_s": mm("init_s"),
            "fds": mm("fds"), "sockets": mm("sockets"), "threads": mm("threads"),
            "inboxes": mm("inboxes"), "seg_mib": sum(r["seg_pss"] for r in recs) / 2**20,
            "pss_mib": mm("pss")[0] / 2**20, "pss_gib": sum(r["pss"] for r in recs) / 2**30}


HEAD = ["world", "HCCL_ALGO", "launch->exit (s)", "init mean/max (s)", "fds mean/max",
        "sockets mean/max", "threads", "inboxes mapped mean/max", "segment pages, node (MiB)",
        "PSS/rank (MiB)", "PSS all (GiB)"]


def row(r: dict) -> list:
    if "error" in r:
        return [r["world"], r["algo"], f"failed: {r['error']}"] + [""] * (len(HEAD) - 3)
    return [r["world"], r["algo"], f"{r['exit_s']:.1f}",
            f"{r['init_s'][0]:.2f} / {r['init_s'][1]:.2f}",
            f"{r['fds'][0]:.0f} / {r['fds'][1]}", f"{r['sockets'][0]:.0f} / {r['sockets'][1]}",
            f"{r['threads'][0]:.0f}", f"{r['inboxes'][0]:.1f} / {r['inboxes'][1]}",
            f"{r['seg_mib']:.1f}", f"{r['pss_mib']:.1f}", f"{r['pss_gib']:.2f}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.conns",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="16,64,128")
    ap.add_argument("--algos", default="default,ring")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--write", action="store_true", help="put the table into docs/figures.md")
    a = ap.parse_args(argv)
    rows = []
    print(f"# load average {open('/proc/loadavg').read().split()[0]} at the start", flush=True)
    print("| " + " | ".join(HEAD) + " |", flush=True)
    print("|" + "---|" * len(HEAD), flush=True)
    for world in (int(w) for w in a.worlds.split(",")):
        for algo in a.algos.split(","):
            r = row(run(world, algo, a.timeout))
            rows.append(r)
            print("| " + " | ".join(map(str, r)) + " |", flush=True)
    print(f"# load average {open('/proc/loadavg').read().split()[0]} at the end", flush=True)
    if a.write:
        from benchmarks import figures
        figures.write_section(
            "connections", "What a rank holds for its connections (#39)",
            f"python -m benchmarks.conns --worlds {a.worlds} --algos {a.algos} --write", HEAD,
            rows, "Per rank after init, a 1 KiB and a 1 MiB AllReduce (npurun, one node). "
            "Connections are made at a pair's first use: a ring pairs each rank with two "
            "neighbours; a star's root (HCCL_ALGO unset, small AllReduces) with every rank, "
            "which is the max column. Segment pages: the PSS of the mapped inboxes summed over "
            "the ranks, i.e. what the node's shared memory holds.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
