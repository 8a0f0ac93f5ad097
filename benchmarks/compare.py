"""npusim next to gloo and Open MPI, interleaved in one run: ``python -m benchmarks.compare``.

For every world size and round it runs, one after the other, ``npurun -m hccl.bench`` (with
``--timing median``: each call waited for, median over calls of the slowest rank; ``--target-s``:
the peers' iteration policy, ~0.1 s of warm-up then as many calls as fill the target time),
``gloo_bench.py`` and ``mpi_bench.py`` (the peers' benchmarks, same convention) on the same
sizes and collectives, then prints one markdown table: time (us) for sizes below 1 MiB, busbw
(GB/s, nccl-tests' definition) from 1 MiB up, the medians over rounds, and npusim's ratio to each
peer (above 1 is better for npusim: peer time / npusim time, npusim busbw / peer busbw). A peer
whose script or python is missing, or whose run fails, is skipped with a note. The memory
ceiling of every bandwidth row (``benchmarks.ceiling``: the copies and adds the collective must make,
in as many processes at once, no communication) is measured in every round too, and npusim's
share of it printed; numpy's add bandwidth at 64 MiB on one core closes the run. Every round
also runs ``benchmarks.percall`` at each world: an eager 1 KiB AllReduce taken apart, and a
step of 8 of them eager against a fused task-graph replay.

With ``--json`` the run's medians, the machine (CPU model, cores, the cost of an empty Python call
as ``runtime.bench`` measures it: how fast this machine ran Python in those minutes) and the
commit are written as JSON, and ``--page`` renders that JSON as a markdown page
(``benchmarks.figures``). ``bash benchmarks/compare.sh`` installs the peers and does both.

Example: ``python -m benchmarks.compare --worlds 2,4 --rounds 3``.
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

from benchmarks import ROOT, ceiling, figures, job_env
from hccl.bench import parse_size

_MPI_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather", "broadcast": "bcast",
              "reduce_scatter": "reduce_scatter"}
_LATENCY_BELOW = 1 << 20


def _run(cmd: list[str], out: str, timeout: float, env=None) -> tuple[dict | None, str]:
    """Run one benchmark; its JSON output, or None and why not."""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    except OSError as e:
        return None, str(e)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        return None, f"exit {res.returncode}: {' | '.join(tail)[:300]}"
    try:
        with open(out) as f:
            got = json.load(f)
        got["results"]
        return got, ""
    except (OSError, ValueError, KeyError) as e:
        return None, f"no results ({e})"


def _npusim(world, colls, sizes, target_s, out, timeout):
    rows, notes = [], []
    for coll in colls:
        path = f"{out}.{coll}"
        cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "-m",
               "hccl.bench", "-o", coll, "--sizes", ",".join(map(str, sizes)), "--timing",
               "median", "--target-s", str(target_s), "-w", "3", "-c", "1", "--json", path]
        got, why = _run(cmd, path, timeout, env=job_env())
        if got is None:
            notes.append(f"npusim {coll} w{world}: {why}")
        else:
            rows += got["results"]
    return rows, notes


def _peer(kind, a, world, colls, sizes, out, timeout):
    script = os.path.join(a.peers_dir, "gloo_bench.py" if kind == "gloo" else "mpi_bench.py")
    if not os.path.exists(script):
        return None, f"{kind}: {script} not found"
    if not os.path.exists(a.peer_python):
        return None, f"{kind}: python {a.peer_python} not found (--peer-python)"
    names = colls if kind == "gloo" else [_MPI_NAMES.get(c, c) for c in colls]
    common = ["--sizes", ",".join(map(str, sizes)), "--colls", ",".join(names), "--target-s",
              str(a.target_s), "--json", out]
    cmd = [a.peer_python, script] + (["--world", str(world)] if kind == "gloo"
                                     else ["--np", str(world)]) + common
    got, why = _run(cmd, out, timeout)
    if got is None:
        return None, f"{kind} w{world}: {why}"
    back = {v: k for k, v in _MPI_NAMES.items()}
    for r in got["results"]:
        r["coll"] = back.get(r["coll"], r["coll"])
    return got, ""


def _percall(world, out, timeout):
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "-m",
           "benchmarks.percall", "--json", out]
    return _run(cmd, out, timeout, env=job_env())


def _ceilings(world, colls, sizes, notes) -> list[dict]:
    """``benchmarks.ceiling`` of every bandwidth row of ``world`` (a failure becomes a note)."""
    rows = []
    for coll in colls:
        for b in sizes:
            if b < _LATENCY_BELOW or coll not in ceiling.COLLS:
                continue
            try:
                rows.append(ceiling.measure(coll, world, b))
            except (RuntimeError, ValueError) as e:
                notes.append(str(e))
    return rows


def _numpy_add_bw(nbytes: int = 64 << 20, reps: int = 5) -> float:
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    np.add(a, b, out=a)
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        best.append(time.perf_counter() - t0)
    return 3 * nbytes / statistics.median(best) / 1e9   # two reads and one write


def machine() -> dict:
    """What the figures depend on: CPU model, cores, interpreter speed, versions."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                         "?")
    except OSError:
        pass
    call_ns = None
    try:   # the same figure runtime.bench prints, from a process of its own
        out = subprocess.run([sys.executable, "-m", "runtime.bench", "--iters", "500"],
                             capture_output=True, text=True, timeout=300, env=job_env()).stdout
        call_ns = next(float(ln.split()[-4]) for ln in out.splitlines()
                       if ln.startswith("empty Python function call"))
    except (subprocess.TimeoutExpired, OSError, StopIteration, ValueError, IndexError):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": sys.version.split()[0],
            "numpy": np.__version__, "empty_call_ns": call_ns}


def commit() -> str:
    """The checkout's commit, ``+dirty`` when tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD") or "unknown"
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--colls", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--sizes", default="1K,64K,1M,16M,64M")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions (medians)")
    ap.add_argument("--target-s", type=float, default=0.2,
                    help="seconds of calls per size, after ~0.1 s of warm-up (every system)")
    ap.add_argument("--peers-dir", default=os.path.join(ROOT, "benchmarks", "peers"))
    ap.add_argument("--peer-python", default=sys.executable,
                    help="the interpreter with torch and mpi4py (default: this one)")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the memory ceilings")
    ap.add_argument("--no-percall", action="store_true", help="skip benchmarks.percall")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per benchmark run")
    ap.add_argument("--json", help="write the run (medians, machine, commit, command) here")
    ap.add_argument("--page", help="render the run as a markdown page here (benchmarks.figures)")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.target_s <= 0:
        ap.error(f"--rounds must be >= 1 and --target-s > 0, got {a.rounds} and {a.target_s}")
    worlds = [int(w) for w in a.worlds.split(",")]
    colls = a.colls.split(",")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    systems = ["npusim"] + [k for k, off in (("gloo", a.no_gloo), ("mpi", a.no_mpi)) if not off]
    got: dict = {}          # (system, world, coll, bytes) -> [(time_us, busbw, wrong)]
    notes: list[str] = []
    versions: dict = {}
    percall: dict = {}      # world -> {figure: [value per round]}
    with tempfile.TemporaryDirectory(prefix="npusim-compare-") as tmp:
        for rnd in range(a.rounds):
            for w in worlds:
                for system in systems:
                    out = os.path.join(tmp, f"{system}-{w}-{rnd}.json")
                    print(f"# round {rnd + 1}/{a.rounds}: {system}, world {w}", file=sys.stderr,
                          flush=True)
                    if system == "npusim":
                        rows, why = _npusim(w, colls, sizes, a.target_s, out, a.timeout)
                        notes += why
                    else:
                        run, why = _peer(system, a, w, colls, sizes, out, a.timeout)
                        rows = run["results"] if run else []
                        for key in ("torch", "mpi"):
                            if run and key in run:
                                versions[key] = run[key].split(",")[0]
                        if why:
                            notes.append(why)
                    for r in rows or []:
                        if "time_us" in r:
                            got.setdefault((system, w, r["coll"], r["bytes"]), []).append(
                                (r["time_us"], r.get("busbw_GBps", 0.0), r.get("wrong", 0)))
                if not a.no_percall:
                    print(f"# round {rnd + 1}/{a.rounds}: percall, world {w}", file=sys.stderr,
                          flush=True)
                    pc, why = _percall(w, os.path.join(tmp, f"percall-{w}-{rnd}.json"),
                                       a.timeout)
                    if pc is None:
                        notes.append(f"percall w{w}: {why}")
                    else:
                        for k, v in pc["results"].items():
                            percall.setdefault(w, {}).setdefault(k, []).append(v)
                if a.no_ceiling:
                    continue
                print(f"# round {rnd + 1}/{a.rounds}: memory ceiling, world {w}", file=sys.stderr,
                      flush=True)
                for r in _ceilings(w, colls, sizes, notes):
                    got.setdefault(("ceiling", w, r["coll"], r["bytes"]), []).append(
                        (r["time_us"], r["busbw_GBps"], 0))
    systems += [] if a.no_ceiling else ["ceiling"]
    run = {"command": "python -m benchmarks.compare " + " ".join(argv if argv is not None
                                                                  else sys.argv[1:]),
           "commit": commit(), "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "machine": dict(machine(), **versions, numpy_add_GBps=round(_numpy_add_bw(), 2),
                           load_average=round(os.getloadavg()[0], 2)),
           "worlds": worlds, "colls": colls, "sizes": sizes, "rounds": a.rounds,
           "target_s": a.target_s, "systems": systems,
           "wrong": sum(x[2] for k, v in got.items() if k[0] == "npusim" for x in v),
           "rows": medians(got, worlds, colls, sizes, systems),
           "percall": {str(w): {k: (all(v) if isinstance(v[0], bool) else statistics.median(v))
                                for k, v in figs.items()} for w, figs in percall.items()},
           "notes": list(dict.fromkeys(notes))}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(run, f, indent=1)
    if a.page:
        with open(a.page, "w") as f:
            f.write(figures.render(run))
    print(figures.table(run))
    m = run["machine"]
    print(f"\nnumpy add at 64 MiB on one core, same run: {m['numpy_add_GBps']:.1f} GB/s (2 reads + "
          f"1 write). load average at the end: {m['load_average']:.1f} on {m['cores']} cores.")
    print(f"npusim wrong elements (-c 1): {run['wrong']}")
    for n in run["notes"]:
        print(f"note: {n}")
    return 0


def medians(got, worlds, colls, sizes, systems) -> list[dict]:
    """One row per (world, collective, size): each system's median over rounds (us below 1 MiB,
    busbw GB/s from 1 MiB up; None where it did not run)."""
    rows = []
    for w in worlds:
        for c in colls:
            for b in sizes:
                lat = b < _LATENCY_BELOW
                row = {"world": w, "coll": c, "bytes": b, "unit": "us" if lat else "busbw GB/s"}
                for s in systems:
                    xs = got.get((s, w, c, b))
                    row[s] = statistics.median(x[0] if lat else x[1] for x in xs) if xs else None
                rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
