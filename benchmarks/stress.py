"""Stress harness: many fresh npurun jobs around every threshold, counting hangs and wrong results.

``python -m benchmarks.stress --jobs 200 --worlds 3,4 --shm on`` starts each job as a new
``npurun --nproc-per-node W -m benchmarks.stress --salt J --worker CASE...`` run: fresh interpreters
every time, because start-up is where races live. A job prepares its first case's buffers,
creates the communicator and enqueues that collective at once, then runs its other cases back to
back. Every rank checks every result exactly (integer data) against numpy and prints one
``STRESS-RESULT`` line. The cases straddle the one-shot AllReduce limit (64 KiB), the star
AllReduce's (4 MiB), the star AllGather's (64 KiB gathered),
``NPUSIM_SHM_MIN_BYTES`` (512 KiB) and the slice size (``HCCL_BUFFSIZE=1``: 1 MiB slices;
default: 8 MiB wire slices), in place and out of place, for every collective and send/recv and
barrier.

A job is a *hang* when a rank raised ``HcclTimeoutError`` (``HCCL_EXEC_TIMEOUT`` is short) or
the job outlived its wall-clock limit and was killed; *wrong* when a rank saw a wrong element;
an *error* when it failed any other way. Exit status 1 if any job hung or was wrong, 2 on errors
only. ``--log-dir`` keeps every failing job's output.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import job_env

KiB, MiB = 1 << 10, 1 << 20
ONE_SHOT, SHM_MIN, SLICE_SMALL, WIRE_SLICE = 64 * KiB, 512 * KiB, 1 * MiB, 8 * MiB
STAR = 4 * MiB            # schedule.STAR_BYTES: AllReduce through rank 0 from 3 ranks on
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
       "sendrecv", "barrier"]
REDOPS = ["SUM", "PROD", "MAX", "MIN"]
DTYPES = ["int32", "int8", "int64", "uint16"]
ITEMSIZE = {"int32": 4, "int8": 1, "int64": 8, "uint16": 2}
# env profiles: (name, environment); NPUSIM_SHM is set separately
PROFILES = [("slice1M", {"HCCL_BUFFSIZE": "1"}), ("default", {})]


def unit_sizes(short: bool) -> list[int]:
    """Payload sizes (bytes of one message's worth) below, at and above every threshold."""
    sizes = [0, 8, 4 * KiB]
    for t in (ONE_SHOT, SHM_MIN, SLICE_SMALL):
        sizes += [t - 8, t, t + 8]
    sizes += [2 * MiB + 8, STAR - 8, STAR, STAR + 8]
    if not short:
        sizes += [WIRE_SLICE, WIRE_SLICE + 8]
    return sizes


# --- cases: "op:dtype:count:root:flags" strings, so a job's cases travel on its command line --

def case_matrix(world: int, short: bool) -> list[str]:
    """Every collective at every size; AllReduce also at world x size (ring chunk = size),
    AllGather also at size / world (gathered = size: around the star AllGather's limit)."""
    out = []
    for i, (unit, op) in enumerate(itertools.product(unit_sizes(short), OPS)):
        if op == "barrier" and unit:
            continue
        dtype = DTYPES[(i + i // len(OPS)) % len(DTYPES)]
        item = ITEMSIZE[dtype]
        root = i % world
        units = [unit, unit * world] if op == "all_reduce" else \
            [unit, unit // world] if op == "all_gather" and unit >= world else [unit]
        for k, nbytes in enumerate(units):
            if op == "all_reduce" and k == 1 and nbytes > 8 * MiB and short:
                continue
            flags = "i" if (i + k) % 2 and op in ("all_reduce", "reduce") else "o"
            out.append(f"{op}:{dtype}:{nbytes // item}:{root}:{flags}")
    return out


PERIOD = 251  # prime: a block landing anywhere but a multiple of 251 elements away shows


def _inputs(rank: int, count: int, dtype, salt: int, start: int = 0):
    """Elements start..start+count of rank's input: ``(i*(2 rank+3) + 7 salt + rank) % 251 - 125``.

    Periodic, so inputs and reductions of any size cost one period and a tile (a loaded machine
    must not turn the harness's own numpy work into a wall-clock kill).
    """
    import numpy as np
    period = ((np.arange(PERIOD) * (2 * rank + 3) + 7 * salt + rank) % PERIOD - 125).astype(dtype)
    return np.resize(np.roll(period, -(start % PERIOD)), count)


def _reduce(arrays, redop: str, dtype):
    import numpy as np
    fn = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[redop]
    with np.errstate(over="ignore"):
        return functools.reduce(lambda a, b: fn(a, b, dtype=dtype), arrays).astype(dtype)


def _parse(spec: str, index: int):
    op, dtype, count, root, flags = spec.split(":")
    return op, dtype, int(count), int(root), flags == "i", REDOPS[index % len(REDOPS)]


def _prepare(comm_size: int, rank: int, spec: str, index: int, salt: int):
    """Device buffers for one case (before the communicator exists, for the first case)."""
    import numpy as np
    import runtime
    op, dtype, count, root, inplace, _ = _parse(spec, index)
    n = count * comm_size if op in ("reduce_scatter", "all_to_all") else count
    if op == "barrier":
        return None, None
    if op == "broadcast":
        host = _inputs(rank, n, dtype, salt) if rank == root else np.zeros(n, dtype)
        buf = runtime.to_device(host)
        return buf, buf
    send = runtime.to_device(_inputs(rank, n, dtype, salt))
    if inplace:
        return send, send
    recv_n = {"all_gather": count * comm_size, "reduce_scatter": count}.get(op, n)
    return send, runtime.empty(recv_n, np.dtype(dtype))


def _enqueue(comm, spec: str, index: int, send, recv, stream) -> None:
    import hccl
    from hccl import DataType, ReduceOp
    from hccl.bench import enqueue
    op, dtype, count, root, _, redop = _parse(spec, index)
    dt, rop = DataType.of(dtype), ReduceOp[redop]
    rank, size = comm.rank, comm.size
    if op != "sendrecv":
        enqueue(op, comm, send, recv, count, dt, rop, stream, root)
    else:  # ring shift; even ranks send first so the order never deadlocks
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        calls = [lambda: hccl.send(send, count, dt, nxt, comm, stream),
                 lambda: hccl.recv(recv, count, dt, prv, comm, stream)]
        for call in (calls if rank % 2 == 0 else calls[::-1]):
            call()


def _expected(size: int, rank: int, spec: str, index: int, salt: int):
    """What this rank's recv must hold, or None where nothing is defined."""
    import numpy as np
    op, dtype, count, root, _, redop = _parse(spec, index)
    dt = np.dtype(dtype)
    ins = functools.partial(_inputs, count=count, dtype=dt, salt=salt)
    if op == "all_reduce" or (op == "reduce" and rank == root) or op == "reduce_scatter":
        period = _reduce([_inputs(r, PERIOD, dt, salt) for r in range(size)], redop, dt)
        start = rank * count if op == "reduce_scatter" else 0
        return np.resize(np.roll(period, -(start % PERIOD)), count)
    if op == "all_gather":
        return np.concatenate([ins(r) for r in range(size)])
    if op == "broadcast":
        return ins(root)
    if op == "all_to_all":
        return np.concatenate([ins(r, start=rank * count) for r in range(size)])
    if op == "sendrecv":
        return ins((rank - 1) % size)
    return None


def worker(specs: list[str], salt: int) -> int:
    """One rank of a stress job: first case right after init, then the rest; report per case."""
    import numpy as np
    import hccl
    import runtime
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    runtime.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    report = {"rank": rank, "checked": 0, "wrong": []}
    index = 0
    try:
        bufs = _prepare(size, rank, specs[0], 0, salt)
        comm = hccl.init_comm()
        stream = runtime.Stream()
        for index, spec in enumerate(specs):
            if index:
                bufs = _prepare(size, rank, spec, index, salt + index)
            _enqueue(comm, spec, index, *bufs, stream)
            stream.synchronize()
            exp = _expected(size, rank, spec, index, salt + index)
            if exp is not None:
                got = bufs[1].to_host()
                bad = int(np.count_nonzero(got != exp)) if got.shape == exp.shape else -1
                if bad:
                    first = int(np.flatnonzero(got != exp)[0]) if bad > 0 else -1
                    report["wrong"].append({"case": index, "spec": spec, "elements": bad,
                                            "first": first})
            report["checked"] += 1
            for b in {id(b): b for b in bufs if b is not None}.values():
                b.free()
        comm.destroy()
        runtime.reset_device()
    except Exception as e:  # reported to the harness, which classifies it
        report["error"] = {"case": index, "spec": specs[index], "type": type(e).__name__,
                           "timeout": isinstance(e, hccl.HcclTimeoutError),
                           "message": str(e)[:400]}
    print("STRESS-RESULT " + json.dumps(report), flush=True)
    return 1 if report["wrong"] or "error" in report else 0


# --- the harness -----------------------------------------------------------------------------

def plan(jobs: int, worlds: list[int], shms: list[str], per_job: int, short: bool):
    """(world, shm, profile name, env, specs) for each job; first cases alternate large/small."""
    combos = list(itertools.product(worlds, shms, PROFILES))
    out = []
    cursor: dict = {}

    def take(key, items, n):
        c = cursor.get(key, 0)
        cursor[key] = c + n
        return [items[(c + i) % len(items)] for i in range(n)]

    for j in range(jobs):
        world, shm, (pname, penv) = combos[j % len(combos)]
        matrix = case_matrix(world, short)
        if (j // len(combos)) % 4 == 3:
            first = take((world, "small"), [s for s in matrix if 0 < _nbytes(s) < SHM_MIN], 1)
        else:
            first = take((world, "large"), [s for s in matrix if _nbytes(s) >= SHM_MIN], 1)
        env = dict(penv, NPUSIM_SHM="1" if shm == "on" else "0")
        out.append((world, shm, pname, env, first + take(world, matrix, per_job - 1)))
    return out


def _nbytes(spec: str) -> int:
    _, dtype, count, _, _ = spec.split(":")
    return int(count) * ITEMSIZE[dtype]


def run_job(world, env_extra, specs, exec_timeout: float, wall: float, salt: int = 0):
    """Start one npurun job; returns (verdict, seconds, output)."""
    from tests.leakcheck import MARKER, tagged_pids
    tag = f"stress-{os.getpid()}-{time.monotonic_ns()}"
    env = job_env(**env_extra, HCCL_EXEC_TIMEOUT=str(exec_timeout),
                  HCCL_CONNECT_TIMEOUT=str(max(exec_timeout, 60)), **{MARKER: tag})
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "-m", "benchmarks.stress",
           "--salt", str(salt), "--worker", *specs]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        killed = False
        try:
            p.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            killed = True
        finally:  # the wall clock ran out, or the harness was interrupted: stop the job
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # npurun stops its ranks (SIGKILL after its grace)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for pid in tagged_pids(tag):  # never leave a rank behind, whatever npurun did
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        seconds = time.monotonic() - t0
        out.seek(0)
        text = out.read()
    return classify(text, p.returncode, killed, world), seconds, text


def classify(text: str, rc: int, killed: bool, world: int) -> str:
    """'ok', 'hang', 'wrong' or 'error' from a job's output and exit status."""
    reports = []
    for line in text.splitlines():
        _, sep, rest = line.partition("STRESS-RESULT ")
        if sep:
            reports.append(json.loads(rest))
    if any(r["wrong"] for r in reports):
        return "wrong"
    if killed or any(r.get("error", {}).get("timeout") for r in reports):
        return "hang"
    if rc != 0 or len(reports) != world or any("error" in r for r in reports):
        return "error"
    return "ok"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.stress", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=None, help="fresh jobs (default 200; --short 24)")
    ap.add_argument("--worlds", default=None, help="comma list (default 2,3,4,5; --short 3,4)")
    ap.add_argument("--shm", default="on,off", help="on, off or on,off (default on,off)")
    ap.add_argument("--cases-per-job", type=int, default=None, help="default 4; --short 3")
    ap.add_argument("--exec-timeout", type=float, default=10, help="HCCL_EXEC_TIMEOUT (s)")
    ap.add_argument("--wall", type=float, default=None,
                    help="kill a job after this many seconds (default 10 x exec-timeout + 60: a "
                         "backstop for a rank stuck outside any wait; the wait timeout catches the "
                         "rest)")
    ap.add_argument("--short", action="store_true", help="CI profile: small sizes, fewer jobs")
    ap.add_argument("--log-dir", default=None, help="write each failing job's output here")
    ap.add_argument("--worker", nargs="+", metavar="CASE", help=argparse.SUPPRESS)
    ap.add_argument("--salt", type=int, default=0, help=argparse.SUPPRESS)  # varies the inputs
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a.worker, a.salt)
    jobs = a.jobs if a.jobs is not None else (24 if a.short else 200)
    worlds = [int(w) for w in (a.worlds or ("3,4" if a.short else "2,3,4,5")).split(",")]
    shms = a.shm.split(",")
    if jobs < 1 or any(w < 2 for w in worlds) or not set(shms) <= {"on", "off"}:
        ap.error(f"need --jobs >= 1 (got {jobs}), worlds >= 2 (got {worlds}), --shm on/off "
                 f"(got {a.shm})")
    per_job = a.cases_per_job or (3 if a.short else 4)
    wall = a.wall or 10 * a.exec_timeout + 60
    rows: dict = {}
    failures = []
    t_all = time.monotonic()
    for j, (world, shm, pname, env, specs) in enumerate(plan(jobs, worlds, shms, per_job, a.short)):
        verdict, seconds, text = run_job(world, env, specs, a.exec_timeout, wall, salt=j)
        row = rows.setdefault((world, shm, pname), dict(cases=0, jobs=0, hang=0, wrong=0,
                                                          error=0, seconds=0.0))
        row["jobs"] += 1
        row["cases"] += len(specs)
        row["seconds"] += seconds
        if verdict != "ok":
            row[verdict] += 1
            failures.append((j, verdict, world, env, specs))
            print(f"job {j}: {verdict.upper()} world {world} env {env} salt {j} cases {specs}",
                  flush=True)
            if a.log_dir:
                os.makedirs(a.log_dir, exist_ok=True)
                with open(os.path.join(a.log_dir, f"job{j}-{verdict}.log"), "w") as f:
                    f.write(f"world {world} env {env} salt {j} cases {specs}\n{text}")
        if (j + 1) % 20 == 0:
            print(f"... {j + 1}/{jobs} jobs, {len(failures)} failed so far, "
                  f"{time.monotonic() - t_all:.0f} s", file=sys.stderr, flush=True)
    print_table(rows, time.monotonic() - t_all)
    total = {k: sum(r[k] for r in rows.values()) for k in ("hang", "wrong", "error")}
    return 1 if total["hang"] or total["wrong"] else (2 if total["error"] else 0)


def print_table(rows: dict, elapsed: float) -> None:
    head = f"{'world':>5} {'shm':>4} {'profile':>8} {'cases':>6} {'jobs':>5} {'hangs':>6} " \
           f"{'wrong':>6} {'errors':>6} {'seconds':>8}"
    print(head)
    tot = dict(cases=0, jobs=0, hang=0, wrong=0, error=0, seconds=0.0)
    for (world, shm, pname), r in sorted(rows.items()):
        print(f"{world:>5} {shm:>4} {pname:>8} {r['cases']:>6} {r['jobs']:>5} {r['hang']:>6} "
              f"{r['wrong']:>6} {r['error']:>6} {r['seconds']:>8.1f}")
        for k in tot:
            tot[k] += r[k]
    print(f"{'all':>5} {'':>4} {'':>8} {tot['cases']:>6} {tot['jobs']:>5} {tot['hang']:>6} "
          f"{tot['wrong']:>6} {tot['error']:>6} {elapsed:>8.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
