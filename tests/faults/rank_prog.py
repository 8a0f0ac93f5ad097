"""One rank of a fault test, started without npurun (root-info init): loops all_reduces and writes
what happened to it as JSON.

    python rank_prog.py OUT_DIR RANK NRANKS PLAN_JSON

PLAN: ``count`` (float32 elements), ``iters``, ``victim``, ``at`` (iteration), ``how`` (what the
victim does to itself at ``at``: "kill" = SIGKILL, "exit" = os._exit(3), "close" = close its
transport (the process lives on), "reset" = shut its TCP connections down under the transport and
pause 3 s; null = the test acts from outside). Files in OUT_DIR:
``root_info`` (rank 0), ``ready.<rank>`` (pid, after init), ``running.<rank>`` (its first
collective checked), ``dying.<rank>`` (victim, the time
just before it acts), ``result.<rank>`` (iterations done, or the error: type, rank, text, time).
"""
import json
import os
import signal
import socket
import sys
import time

import numpy as np


def write(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def shut_tcp_sockets():
    """Shut down every connected TCP socket of this process (the transport's, under it)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                s.getpeername()
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()


def main():
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # stacks on demand, for debugging
    out, rank, n, plan = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    import hccl
    import runtime
    from runtime.errors import TaskError
    info_path = os.path.join(out, "root_info")
    if rank == 0:
        info = hccl.get_root_info()
        fd = os.open(info_path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(info)
        os.replace(info_path + ".tmp", info_path)
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(info_path):
            if time.monotonic() > deadline:
                sys.exit("no root info after 60 s")
            time.sleep(0.02)
        with open(info_path, "rb") as f:
            info = f.read()
    runtime.set_device(rank)
    comm = hccl.comm_init_root_info(n, info, rank)
    x = runtime.to_device(np.full(plan["count"], rank + 1, np.float32))
    y = runtime.empty(plan["count"], np.float32)
    write(os.path.join(out, f"ready.{rank}"), {"pid": os.getpid()})
    i = 0
    try:
        while i < plan["iters"]:
            if rank == plan["victim"] and i == plan["at"] and plan.get("how"):
                write(os.path.join(out, f"dying.{rank}"), {"t": time.time(), "at": i})
                if plan["how"] == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif plan["how"] == "exit":
                    os._exit(3)
                elif plan["how"] == "close":
                    comm.world.transport.close()
                elif plan["how"] == "reset":
                    shut_tcp_sockets()
                    time.sleep(3)   # longer than a liveness check and the grace: seen broken
            comm.all_reduce(x, y)
            runtime.current_stream().synchronize()
            if i == 0:
                want = n * (n + 1) / 2
                got = y.to_host()
                assert (got == want).all(), (got[:4], want)
                write(os.path.join(out, f"running.{rank}"), {"t": time.time()})   # a collective done
            i += 1
        write(os.path.join(out, f"result.{rank}"), {"ok": i})
    except Exception as e:   # what the user would see, and when
        err = e.__cause__ if isinstance(e, TaskError) and e.__cause__ is not None else e
        write(os.path.join(out, f"result.{rank}"),
              {"t": time.time(), "iters": i, "type": type(err).__name__,
               "rank": getattr(err, "rank", None), "text": str(err)})
    comm.destroy()


if __name__ == "__main__":
    main()
