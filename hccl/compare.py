"""npusim next to gloo and Open MPI, interleaved in one run: ``python -m hccl.compare``.

For every world size and round it runs, one after the other, ``npurun -m hccl.bench`` (with
``--timing median``: each call waited for, median over calls of the slowest rank; ``--target-s``:
the peers' iteration policy, ~0.1 s of warm-up then as many calls as fill the target time),
``gloo_bench.py`` and ``mpi_bench.py`` (the peers' benchmarks, same convention) on the same
sizes and collectives, then prints one markdown table: time (us) for sizes below 1 MiB, busbw
(GB/s, nccl-tests' definition) from 1 MiB up, the medians over rounds, and npusim's ratio to each
peer (above 1 is better for npusim: peer time / npusim time, npusim busbw / peer busbw). A peer
whose script or python is missing, or whose run fails, is skipped with a note. The memory
ceiling of every bandwidth row (``hccl.ceiling``: the copies and adds the collective must make,
in as many processes at once, no communication) is measured in every round too, and npusim's
share of it printed; numpy's add bandwidth at 64 MiB on one core closes the run.

Example: ``python -m hccl.compare --worlds 2,4 --rounds 3``.
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

from hccl import ceiling
from hccl.bench import parse_size

_MPI_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather", "broadcast": "bcast",
              "reduce_scatter": "reduce_scatter"}
_LATENCY_BELOW = 1 << 20


def _human(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _run(cmd: list[str], out: str, timeout: float, env=None) -> tuple[list[dict] | None, str]:
    """Run one benchmark; its JSON results, or None and why not."""
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
            return json.load(f)["results"], ""
    except (OSError, ValueError, KeyError) as e:
        return None, f"no results ({e})"


def _npusim(world, colls, sizes, target_s, out, timeout):
    rows, notes = [], []
    for coll in colls:
        path = f"{out}.{coll}"
        cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "-m",
               "hccl.bench", "-o", coll, "--sizes", ",".join(map(str, sizes)), "--timing",
               "median", "--target-s", str(target_s), "-w", "3", "-c", "1", "--json", path]
        got, why = _run(cmd, path, timeout)
        if got is None:
            notes.append(f"npusim {coll} w{world}: {why}")
        else:
            rows += got
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
    rows, why = _run(cmd, out, timeout)
    if rows is None:
        return None, f"{kind} w{world}: {why}"
    back = {v: k for k, v in _MPI_NAMES.items()}
    for r in rows:
        r["coll"] = back.get(r["coll"], r["coll"])
    return rows, ""


def _ceilings(world, colls, sizes, notes) -> list[dict]:
    """``hccl.ceiling`` of every bandwidth row of ``world`` (a failure becomes a note)."""
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hccl.compare", description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--colls", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--sizes", default="1K,64K,1M,16M,64M")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved repetitions (medians)")
    ap.add_argument("--target-s", type=float, default=0.5,
                    help="seconds of calls per size, after ~0.1 s of warm-up (every system)")
    ap.add_argument("--peers-dir", default="/work/shared/peers")
    ap.add_argument("--peer-python", default="/tmp/peers/venv/bin/python")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the memory ceilings")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per benchmark run")
    a = ap.parse_args(argv)
    worlds = [int(w) for w in a.worlds.split(",")]
    colls = a.colls.split(",")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    systems = ["npusim"] + [k for k, off in (("gloo", a.no_gloo), ("mpi", a.no_mpi)) if not off]
    got: dict = {}          # (system, world, coll, bytes) -> [(time_us, busbw, wrong)]
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hccl-compare-") as tmp:
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
                        rows, why = _peer(system, a, w, colls, sizes, out, a.timeout)
                        if why:
                            notes.append(why)
                    for r in rows or []:
                        if "time_us" in r:
                            got.setdefault((system, w, r["coll"], r["bytes"]), []).append(
                                (r["time_us"], r.get("busbw_GBps", 0.0), r.get("wrong", 0)))
                if a.no_ceiling:
                    continue
                print(f"# round {rnd + 1}/{a.rounds}: memory ceiling, world {w}", file=sys.stderr,
                      flush=True)
                for r in _ceilings(w, colls, sizes, notes):
                    got.setdefault(("ceiling", w, r["coll"], r["bytes"]), []).append(
                        (r["time_us"], r["busbw_GBps"], 0))
    add_bw = _numpy_add_bw()
    print(_table(got, worlds, colls, sizes, systems + ([] if a.no_ceiling else ["ceiling"])))
    print(f"\nnumpy add at 64 MiB on one core, same run: {add_bw:.1f} GB/s (2 reads + 1 write). "
          f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.")
    wrong = sum(x[2] for k, v in got.items() if k[0] == "npusim" for x in v)
    print(f"npusim wrong elements (-c 1): {wrong}")
    for n in dict.fromkeys(notes):
        print(f"note: {n}")
    return 0


def _table(got, worlds, colls, sizes, systems) -> str:
    label = {"npusim": "npusim", "gloo": "gloo", "mpi": "Open MPI", "ceiling": "ceiling"}
    head = ["world", "collective", "size", "unit"] + [label[s] for s in systems] + \
        [f"npusim / {label[s]}" for s in systems[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in worlds:
        for c in colls:
            for b in sizes:
                lat = b < _LATENCY_BELOW
                vals = {}
                for s in systems:
                    xs = got.get((s, w, c, b))
                    vals[s] = statistics.median(x[0] if lat else x[1] for x in xs) if xs else None
                cells = [str(w), c, _human(b), "us" if lat else "busbw GB/s"]
                cells += ["—" if vals[s] is None else (f"{vals[s]:,.1f}" if lat else
                                                       f"{vals[s]:.2f}") for s in systems]
                for s in systems[1:]:
                    mine, theirs = vals["npusim"], vals[s]
                    if not mine or not theirs:
                        cells.append("—")
                    else:
                        cells.append(f"{(theirs / mine if lat else mine / theirs):.2f}x")
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
