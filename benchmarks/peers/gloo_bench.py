"""torch.distributed (gloo backend, CPU) collective benchmark, one OS process per rank.

Usage: python benchmarks/peers/gloo_bench.py --world 2 [--sizes 1024,65536,1048576,16777216,67108864]
                            [--target-s 1.0] [--json out.json]

Launch: torch.multiprocessing.spawn (start method 'spawn'), 1 intra-op thread per rank,
rendezvous tcp://127.0.0.1 on a free port, GLOO_SOCKET_IFNAME=lo. float32 tensors, filled with zeros.
Size convention (nccl-tests): S = bytes of the tensor for all_reduce / broadcast,
S = total OUTPUT bytes for all_gather (each rank contributes S/n), S = total INPUT bytes
for reduce_scatter (each rank keeps S/n).  algbw = S / t;
busbw: all_reduce algbw*2(n-1)/n, all_gather & reduce_scatter algbw*(n-1)/n, broadcast algbw.
t = median over iterations of the per-iteration MAX over ranks of the op's wall time
(ops issued back to back, each timed with perf_counter). Iterations: warm-up, then enough
for ~target-s seconds (min 5). GB = 1e9 bytes.
Also reports startup: spawn->worker entry (interpreter + `import torch`), init_process_group,
first all_reduce, and spawn->join wall time of the whole run.
"""
import argparse, json, math, os, socket, statistics, time

import peer_args  # beside this script
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "barrier": lambda n: 0.0}


def make_op(name, size, n, rank):
    """Return (callable, api_name) for one collective on S=size bytes."""
    e = size // 4
    if name == "all_reduce":
        x = torch.zeros(e)
        return (lambda: dist.all_reduce(x)), "all_reduce"
    if name == "broadcast":
        x = torch.zeros(e)
        return (lambda: dist.broadcast(x, src=0)), "broadcast"
    if name == "barrier":
        return dist.barrier, "barrier"
    if name == "all_gather":
        out, inp = torch.empty(e), torch.zeros(e // n)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # 2.13 renamed it
        try:
            fn(out, inp)
            return (lambda: fn(out, inp)), fn.__name__
        except Exception:
            outs = list(out.chunk(n))
            return (lambda: dist.all_gather(outs, inp)), "all_gather(list)"
    if name == "reduce_scatter":
        inp, out = torch.zeros(e), torch.empty(e // n)
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        fn(out, inp)   # raises if the backend lacks it
        return (lambda: fn(out, inp)), fn.__name__
    raise ValueError(name)


def agree_max(v):
    t = torch.tensor([float(v)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def worker(rank, world, t_spawn, port, cfg, out_path):
    t_entry = time.monotonic()
    torch.set_num_threads(1)
    t0 = time.monotonic()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t_init = time.monotonic() - t0
    t0 = time.monotonic()
    dist.all_reduce(torch.ones(1))
    t_first = time.monotonic() - t0
    startup = {"launch_s": agree_max(t_entry - t_spawn), "init_process_group_s": agree_max(t_init),
               "first_all_reduce_s": agree_max(t_first)}
    results = []
    for name in cfg["colls"]:
        for size in (cfg["sizes"] if name != "barrier" else [0]):
            rec = {"coll": name, "world": world, "bytes": size}
            try:
                op, api = make_op(name, size, world, rank)
            except Exception as ex:  # unsupported by gloo
                rec["error"] = f"{type(ex).__name__}: {str(ex).splitlines()[0][:160]}"
                results.append(rec)
                dist.barrier()
                continue
            rec["api"] = api
            t0 = time.perf_counter()
            for k in range(1, 1000):   # warm-up: >=3 ops and ~0.1 s (all ranks stop together)
                op()
                if k >= 3 and agree_max(time.perf_counter() - t0) > 0.1:
                    break
            t0 = time.perf_counter(); op(); op(); op(); est = agree_max((time.perf_counter() - t0) / 3)
            iters = int(min(cfg["max_iters"], max(5, math.ceil(cfg["target_s"] / max(est, 1e-7)))))
            dist.barrier()
            ts = torch.empty(iters, dtype=torch.float64)
            for i in range(iters):
                t0 = time.perf_counter(); op(); ts[i] = time.perf_counter() - t0
            allts = [torch.empty_like(ts) for _ in range(world)]
            dist.all_gather(allts, ts)
            per_iter = torch.stack(allts).max(dim=0).values
            t = statistics.median(per_iter.tolist())
            rec.update(iters=iters, time_us=t * 1e6, mean_us=per_iter.mean().item() * 1e6)
            if size:
                rec["algbw_GBps"] = size / t / 1e9
                rec["busbw_GBps"] = rec["algbw_GBps"] * BUSBW[name](world)
            results.append(rec)
            if rank == 0:
                bw = f"algbw {rec.get('algbw_GBps', 0):7.3f} busbw {rec.get('busbw_GBps', 0):7.3f} GB/s" if size else ""
                print(f"  n={world} {name:15} {size:>9} B  {t * 1e6:11.1f} us  {bw}  ({iters} it)", flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"startup": startup, "results": results, "torch": torch.__version__}, f, indent=1)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    peer_args.add_common(ap, colls="all_reduce,all_gather,reduce_scatter,broadcast,barrier",
                         max_iters=20000, json="/tmp/gloo_bench.json")
    ap.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
    a = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cfg = {"sizes": [int(s) for s in a.sizes.split(",")], "colls": a.colls.split(","),
           "target_s": a.target_s, "max_iters": a.max_iters}
    print(f"gloo, world={a.world} on {os.cpu_count()} cores{' (OVERSUBSCRIBED)' if a.world > os.cpu_count() else ''}")
    if not a.port:  # a free port now; another job taking it before rank 0 binds is unlikely
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            a.port = s.getsockname()[1]
    t_spawn = time.monotonic()
    mp.spawn(worker, args=(a.world, t_spawn, a.port, cfg, a.json), nprocs=a.world, join=True)
    wall = time.monotonic() - t_spawn
    peer_args.add_startup(a.json, "spawn_to_join_s", wall)


if __name__ == "__main__":
    main()
