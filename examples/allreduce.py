"""The smallest npusim job: every rank all-reduces a vector on its NPU and prints the result.

Run it with 4 ranks (prints the same sum on every rank):

    npurun --nproc-per-node 4 examples/allreduce.py

Rank r contributes ``[r, r + 1, ..., r + 3]``, so every rank receives
``[s, s + n, s + 2n, s + 3n]`` with ``s = 0 + 1 + ... + (n - 1)`` for ``n`` ranks.
"""
import os

import numpy as np

import hccl
import runtime


def main() -> None:
    runtime.set_device(int(os.environ["LOCAL_RANK"]))
    comm = hccl.init_comm()
    x = runtime.to_device(np.arange(4, dtype=np.float32) + comm.rank)
    stream = runtime.Stream()
    comm.all_reduce(x, op=hccl.ReduceOp.SUM, stream=stream)   # in place, asynchronous
    result = x.to_host(stream=stream)                          # waits for the stream
    print(f"rank {comm.rank}/{comm.size}: all_reduce(SUM) = {result.tolist()}", flush=True)
    comm.destroy()


if __name__ == "__main__":
    main()
