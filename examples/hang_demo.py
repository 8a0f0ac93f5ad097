"""Hang walkthrough: make a job hang (or desync) on purpose and read npurun's verdict.

    HCCL_EXEC_TIMEOUT=10 npurun --nproc-per-node 4 --log-dir logs examples/hang_demo.py sleep

Scenarios (the culprit is always rank 1 or 2; the others do the right thing):
  sleep     rank 2 is stuck in user code (load_batch) before the all_reduce
  mismatch  rank 1 calls all_gather where the others call all_reduce
  count     rank 1 calls the same all_reduce with another count
  dtype     rank 1 calls the same all_reduce with FP16 instead of FP32
  kill      rank 1 is SIGKILLed in the middle of a large all_reduce
  exit      rank 1 calls os._exit(7) in the middle of a large all_reduce
  event     rank 1's communication stream waits for an event that is never reached: the
            kernel before its record blocks forever, so the all_reduce never starts
  subcomm   ranks {0, 2} hang in a sub-communicator: rank 2 sleeps before it
  deadlock  ranks 0 and 1 share the world and a sub-communicator and call them in opposite
            orders: rank 0 waits in the world for rank 1, rank 1 waits in the sub-communicator
            for rank 0 (a cycle, reported within seconds whatever HCCL_EXEC_TIMEOUT is)
  p2p       ranks 0 and 1 each post a receive from the other before their send, on one stream:
            each receive waits for a send queued behind the other's receive (a cycle)
  argerror  rank 1 calls hccl.all_reduce with count=1000 on a 100-element buffer (an argument
            error raised at the call): the others wait for it in the next collective
  numpy     rank 1 passes a numpy array where a DeviceArray is expected
  nonmember rank 2 calls create_sub_comm([0, 1]) without being a member
  raise     rank 1 raises a plain exception of its own (ValueError) between two collectives
  oom       rank 1 allocates more device memory than the NPU has
  slow [MiB] no hang: a large (default 64 MiB), slow but progressing all_reduce under a short
            HCCL_EXEC_TIMEOUT completes (the timeout bounds each wait for a peer, not the whole collective)

npurun prints the failure summary, then ONE verdict naming the culprit(s) with their Python
stacks, writes hang_report.json to --log-dir, and stops the job.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

import hccl
import runtime

SCENARIOS = ("sleep", "mismatch", "count", "dtype", "kill", "exit", "event", "subcomm", "deadlock",
             "p2p", "argerror", "numpy", "nonmember", "raise", "oom", "slow")


def load_batch(seconds: float, say: str = "") -> None:
    """Stands for user code that never returns in time; says ``say`` from inside, first."""
    print(say, flush=True) if say else None
    time.sleep(seconds)


def check_batch(batch: np.ndarray) -> None:
    """Stands for user code that rejects its input: the job's own error, no collective in it."""
    raise ValueError(f"batch has {int(np.isnan(batch).sum())} NaN values, expected none")


def user_error(scenario: str, comm, x) -> None:
    """Rank 1 (rank 2 for ``nonmember``) fails by its own code; the others call the next
    collective and are released by its failure."""
    rank = comm.rank
    if scenario == "argerror" and rank == 1:
        small = runtime.to_device(np.ones(100, np.float32))
        hccl.all_reduce(small, small, 1000, hccl.DataType.FP32, hccl.ReduceOp.SUM, comm,
                        runtime.current_stream())
    elif scenario == "numpy" and rank == 1:
        comm.all_reduce(np.arange(12, dtype=np.float32).reshape(3, 4))
    elif scenario == "nonmember" and rank == 2:
        comm.create_sub_comm([0, 1])
    elif scenario == "raise" and rank == 1:
        check_batch(np.full(8, np.nan, np.float32))
    elif scenario == "oom" and rank == 1:
        runtime.empty(runtime.get_mem_info()[1] // 4 + (1 << 20), np.float32)
    else:
        comm.all_reduce(x)


def main() -> int:
    scenario = sys.argv[1] if len(sys.argv) > 1 else "sleep"
    if scenario not in SCENARIOS:
        print(f"usage: hang_demo.py {{{','.join(SCENARIOS)}}}", file=sys.stderr)
        return 2
    runtime.set_device(int(os.environ["LOCAL_RANK"]))
    comm = hccl.init_comm()
    rank, size = comm.rank, comm.size
    if scenario == "slow":       # the short timeout is for the big collective, not the set-up:
        comm.set_exec_timeout(120)   # on a busy machine ranks arrive seconds apart
    x = runtime.to_device(np.full(1024, rank + 1, np.float32))
    comm.all_reduce(x)                       # seq 1: everyone agrees
    runtime.synchronize()

    if scenario in ("mismatch", "count", "dtype") and rank == 1:
        time.sleep(0.3)      # the odd rank comes last, as one on another code path often does
    if scenario == "sleep":
        if rank == 2:
            load_batch(600, say=f"rank {rank}: load_batch starts")
        comm.all_reduce(x)
    elif scenario == "mismatch":
        if rank == 1:
            g = runtime.empty(1024 * size, np.float32)
            comm.all_gather(x, g)
        else:
            comm.all_reduce(x)
    elif scenario == "count":
        y = runtime.to_device(np.ones(512 if rank == 1 else 1024, np.float32))
        comm.all_reduce(y)
    elif scenario == "dtype":
        y = runtime.to_device(np.ones(1024, np.float16 if rank == 1 else np.float32))
        comm.all_reduce(y)
    elif scenario in ("kill", "exit"):
        big = runtime.to_device(np.ones(32 << 20, np.float32))        # 128 MiB
        comm.barrier()                        # every rank has its buffer: they enter together
        if rank == 1:                         # the others wait inside the collective meanwhile
            runtime.launch(lambda: time.sleep(0.8), name="late_start")
        comm.all_reduce(big)
        if rank == 1:
            while not any(r["state"] == "started" and r["op"] == "ALLREDUCE"
                          for r in hccl.flight_recorder.in_flight()):
                time.sleep(0.01)                  # dies within 10 ms of starting it: inside it
            if scenario == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(7)
    elif scenario == "event":
        compute, comm_stream = runtime.Stream(), runtime.Stream()
        if rank == 1:
            never = threading.Event()
            runtime.launch(never.wait, stream=compute, name="stuck_kernel")
        ready = compute.record_event()         # on rank 1 the stream never gets here
        comm_stream.wait_event(ready)
        comm.all_reduce(x, stream=comm_stream)
        comm_stream.synchronize()
    elif scenario == "subcomm":
        if rank in (0, 2):
            sub = comm.create_sub_comm([0, 2])
            if rank == 2:
                load_batch(600)
            sub.all_reduce(x)
    elif scenario == "deadlock":
        sub = comm.create_sub_comm([0, 1]) if rank in (0, 1) else None
        if rank == 1:
            sub.all_reduce(x)                  # rank 1: the sub-communicator first...
            comm.all_reduce(x)
        else:
            comm.all_reduce(x)                 # ...everyone else (rank 0 too): the world first
            if sub is not None:
                sub.all_reduce(x)
    elif scenario == "p2p":
        if rank in (0, 1):
            y = runtime.empty(1024, np.float32)
            comm.recv(y, 1 - rank)          # posted first on both ranks...
            comm.send(x, 1 - rank)          # ...so each send waits behind its own receive
    elif scenario in ("argerror", "numpy", "nonmember", "raise", "oom"):
        user_error(scenario, comm, x)
    elif scenario == "slow":
        mib = int(sys.argv[2]) if len(sys.argv) > 2 else 64
        big = runtime.to_device(np.full(mib << 18, rank + 1, np.float32))
        comm.barrier()                        # every rank has its buffer: they enter together
        runtime.synchronize()
        comm.set_exec_timeout(float(os.environ.get("HCCL_EXEC_TIMEOUT", "1800")))
        t0 = time.perf_counter()
        comm.all_reduce(big)
        out = big.to_host()
        expected = size * (size + 1) / 2
        ok = bool(np.all(out == expected))
        print(f"rank {rank}: {mib} MiB all_reduce took {time.perf_counter() - t0:.1f} s under "
              f"HCCL_EXEC_TIMEOUT={os.environ.get('HCCL_EXEC_TIMEOUT', '1800')}: "
              f"{'correct' if ok else 'WRONG'}", flush=True)
        if not ok:
            return 1
    runtime.synchronize()
    comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
