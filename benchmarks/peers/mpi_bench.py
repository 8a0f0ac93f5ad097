"""mpi4py + Open MPI collective benchmark (numpy float32), one OS process per rank.

Usage: python benchmarks/peers/mpi_bench.py --np 2 [--sizes 1024,65536,1048576,16777216,67108864]
                           [--target-s 1.0] [--json out.json] [--mpirun-args "..."]
Run plainly, it re-launches itself under
  mpirun --allow-run-as-root --oversubscribe -np N python mpi_bench.py ...
(Open MPI 4.1 on one node: pml ob1, btl vader (shared memory, CMA single copy), coll tuned.)
Same conventions as gloo_bench.py: S = tensor bytes for Allreduce (in place, MPI.IN_PLACE)
and Bcast, total OUTPUT for Allgather, total INPUT for Reduce_scatter_block.
algbw = S/t; busbw: Allreduce *2(n-1)/n, Allgather & Reduce_scatter *(n-1)/n, Bcast *1.
t = median over iterations of per-iteration MAX over ranks. GB = 1e9 bytes.
Startup: mpirun start -> rank's script entry (launch), `import numpy`, `from mpi4py import MPI`
(= MPI_Init), first Allreduce, and the whole mpirun wall time.
"""
import os, sys, time
T_ENTRY = time.monotonic()
import argparse, json, math, shlex, statistics, subprocess
import peer_args  # beside this script

BUSBW = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n, "bcast": lambda n: 1.0, "barrier": lambda n: 0.0}


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, default=2)
    peer_args.add_common(ap, colls="allreduce,allgather,reduce_scatter,bcast,barrier",
                         max_iters=1_000_000, json="/tmp/mpi_bench.json")
    ap.add_argument("--mpirun-args", default="")
    return ap.parse_args()


def launcher(a):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.np)] + shlex.split(a.mpirun_args) \
        + [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
    print(f"MPI, np={a.np} on {os.cpu_count()} cores{' (OVERSUBSCRIBED)' if a.np > os.cpu_count() else ''}: {' '.join(cmd)}", flush=True)
    env = dict(os.environ, PEERS_T0=repr(time.monotonic()))
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, check=True)
    wall = time.monotonic() - t0
    peer_args.add_startup(a.json, "mpirun_wall_s", wall)


def rank_main(a):
    t0 = time.monotonic(); import numpy as np; t_np = time.monotonic() - t0
    t0 = time.monotonic(); from mpi4py import MPI; t_init = time.monotonic() - t0
    comm = MPI.COMM_WORLD; rank, n = comm.rank, comm.size
    t0 = time.monotonic(); comm.Allreduce(MPI.IN_PLACE, np.ones(1, np.float32)); t_first = time.monotonic() - t0
    amax = lambda v: comm.allreduce(float(v), op=MPI.MAX)
    startup = {"launch_s": amax(T_ENTRY - float(os.environ["PEERS_T0"])), "import_numpy_s": amax(t_np),
               "mpi_init_s": amax(t_init), "first_allreduce_s": amax(t_first)}
    results = []
    for name in a.colls.split(","):
        for size in ([int(s) for s in a.sizes.split(",")] if name != "barrier" else [0]):
            e = size // 4
            if name == "allreduce":
                x = np.zeros(e, np.float32); op = lambda: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
            elif name == "allgather":
                s_, r_ = np.zeros(e // n, np.float32), np.empty(e, np.float32); op = lambda: comm.Allgather(s_, r_)
            elif name == "reduce_scatter":
                s_, r_ = np.zeros(e, np.float32), np.empty(e // n, np.float32)
                op = lambda: comm.Reduce_scatter_block(s_, r_, op=MPI.SUM)
            elif name == "bcast":
                x = np.zeros(e, np.float32); op = lambda: comm.Bcast(x, root=0)
            else:
                op = comm.Barrier
            t0 = time.perf_counter()
            for k in range(1, 1000):  # warm-up: >=3 ops and ~0.1 s
                op()
                if k >= 3 and amax(time.perf_counter() - t0) > 0.1:
                    break
            t0 = time.perf_counter(); op(); op(); op(); est = amax((time.perf_counter() - t0) / 3)
            iters = int(min(a.max_iters, max(5, math.ceil(a.target_s / max(est, 1e-7)))))
            comm.Barrier()
            ts = np.empty(iters)
            for i in range(iters):
                t0 = time.perf_counter(); op(); ts[i] = time.perf_counter() - t0
            allts = np.empty((n, iters)) if rank == 0 else None
            comm.Gather(ts, allts, root=0)
            if rank == 0:
                per_iter = allts.max(axis=0); t = float(np.median(per_iter))
                rec = {"coll": name, "world": n, "bytes": size, "iters": iters, "time_us": t * 1e6,
                       "mean_us": float(per_iter.mean()) * 1e6}
                if size:
                    rec["algbw_GBps"] = size / t / 1e9
                    rec["busbw_GBps"] = rec["algbw_GBps"] * BUSBW[name](n)
                results.append(rec)
                bw = f"algbw {rec.get('algbw_GBps', 0):7.3f} busbw {rec.get('busbw_GBps', 0):7.3f} GB/s" if size else ""
                print(f"  n={n} {name:15} {size:>9} B  {t * 1e6:11.1f} us  {bw}  ({iters} it)", flush=True)
    if rank == 0:
        with open(a.json, "w") as f:
            json.dump({"startup": startup, "results": results, "mpi": MPI.Get_library_version().splitlines()[0]}, f, indent=1)


if __name__ == "__main__":
    args = parse()
    if "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ:
        rank_main(args)
    else:
        launcher(args)
