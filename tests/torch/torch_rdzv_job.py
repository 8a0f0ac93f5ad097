"""A torch job on the "hccl" backend started by torch's own rendezvous, without npurun.

    python -m torch.distributed.run --standalone --nproc-per-node N torch_rdzv_job.py env OUT
    python torch_rdzv_job.py tcp|file|store OUT N      (mp.spawn, then that init method)

Each rank writes OUT/rank<r>.json: its all_reduce, sub-group and ring results, and whether
npusim's job secret was in its environment (it must not be: the secret came through torch's
Store).
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def work(rank: int, method: str, out: str, world: int, where: str) -> None:
    import torch
    import torch.distributed as dist

    import hccl.torch_backend  # noqa: F401
    timeout = datetime.timedelta(seconds=60)
    if method == "env":
        dist.init_process_group("hccl", timeout=timeout)
    elif method == "store":
        host, port = where.split(":")
        store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timeout)
        dist.init_process_group("hccl", store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group("hccl", init_method=where, rank=rank, world_size=world,
                                timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    sub = dist.new_group([0, world - 1])
    s = torch.tensor([rank * 10])
    if rank in (0, world - 1):
        dist.all_reduce(s, group=sub)
    got = torch.empty(1, dtype=torch.int64)
    reqs = [dist.irecv(got, (rank - 1) % world), dist.isend(torch.tensor([rank]), (rank + 1) % world)]
    for r in reqs:
        r.wait()
    res = {"rank": rank, "world": world, "all_reduce": t.tolist(), "sub": s.tolist(),
           "ring": got.tolist(), "backend": dist.get_backend(),
           "secret_in_env": "NPUSIM_JOB_SECRET" in os.environ}
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)


def main() -> None:
    method, out = sys.argv[1], sys.argv[2]
    if method == "env":      # under torchrun: RANK, WORLD_SIZE, MASTER_* from torch's agent
        work(int(os.environ["RANK"]), method, out, int(os.environ["WORLD_SIZE"]), "")
        return
    import torch.multiprocessing as mp
    world = int(sys.argv[3])
    where = {"tcp": f"tcp://127.0.0.1:{_free_port()}",
             "file": f"file://{os.path.join(out, 'rdzv_file')}",
             "store": f"127.0.0.1:{_free_port()}"}[method]
    mp.spawn(work, args=(method, out, world, where), nprocs=world, join=True)


if __name__ == "__main__":
    main()
