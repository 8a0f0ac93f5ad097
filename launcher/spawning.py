"""``launcher.spawn``: run ``fn(rank, *args)`` in ``nprocs`` fresh interpreters, like torch's spawn.

The caller's process plays the launcher: it hosts the job's store on loopback, gives every rank
the same environment as npurun does (so ``hccl.init_comm()`` works inside ``fn``), pumps the ranks'
output with ``[rank N]:`` prefixes into its own ``sys.stdout`` / ``sys.stderr``, and cleans up
(processes, process groups, ``/dev/shm/npusim-<job>-*``, temp files) whatever happens.

``fn`` and ``args`` are shipped with cloudpickle in a file of a private (0700) temporary directory,
never on a command line; each rank writes its return value (cloudpickle) back there. The ranks are
all started before any is waited for, so their interpreters start in parallel.
"""
from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from launcher import config, secret
from launcher.procs import proc, shm, stacks
from launcher.procs.env import JobInfo, worker_env
from launcher.errors import (ProcessExitedError, ProcessRaisedError, SpawnTimeoutError,
                             WorkerFailedError)
from launcher.procs.janitor import Janitor
from launcher.procs.output import OutputPump
from launcher.procs.proc import LogFiles, WorkerProcess
from launcher.diagnosis.summary import ProcessFailure, root_cause


def _error(failures: list[ProcessFailure]) -> WorkerFailedError:
    root = root_cause(failures)
    if root.traceback:
        return ProcessRaisedError(root.rank, root.exitcode, root.traceback, root.message)
    return ProcessExitedError(root.rank, root.exitcode, "", root.message)


def spawn(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *,
          timeout: float | None = None, env: Mapping[str, str] | None = None) -> list[Any]:
    """Run ``fn(rank, *args)`` for rank in ``range(nprocs)``, each in a fresh interpreter.

    Returns the ranks' return values, in rank order. ``env`` adds or overrides environment
    variables of the ranks. ``timeout`` (s) bounds the whole run.

    Raises ``ProcessRaisedError`` (a rank raised: ``.rank``, ``.exitcode``, ``.traceback``) or
    ``ProcessExitedError`` (a rank exited non-zero or was killed without a Python exception)
    for the first failing rank, after stopping the others; ``SpawnTimeoutError`` (with every
    live rank's stacks) when ``timeout`` runs out. Call it from a thread that stays alive until
    it returns (the ranks' parent-death signal follows the calling thread).
    """
    import cloudpickle  # noqa: PLC0415
    from hccl.store import StoreServer  # noqa: PLC0415
    if int(nprocs) < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
    nprocs = int(nprocs)
    payload = pickle.dumps({"sys_path": list(sys.path), "cwd": os.getcwd(),
                            "fn": cloudpickle.dumps((fn, tuple(args)))})
    janitor = Janitor()
    tmp = tempfile.mkdtemp(prefix="npusim-spawn-")
    janitor.watch_dir(tmp)
    key = secret.generate()
    job_id = shm.new_job_id()
    janitor.watch_job(job_id)
    pump, waiter = OutputPump(), proc.Waiter()
    workers: list[WorkerProcess] = []
    server = None
    try:
        server = StoreServer("127.0.0.1", 0, secret.as_bytes(key),
                             name=f"spawn-store-{job_id}").start()
        job = JobInfo(job_id=job_id, run_id=job_id, secret=key, master_addr="127.0.0.1",
                      master_port=server.port, nnodes=1, node_rank=0, nproc_per_node=nprocs)
        payload_path = os.path.join(tmp, "payload.pkl")
        with open(payload_path, "wb") as f:
            f.write(payload)
        base = config.environment()
        python = config.python_exec()
        for rank in range(nprocs):
            files = LogFiles(os.path.join(tmp, str(rank)))
            wenv = worker_env(base, job, rank, 0, files)
            wenv.update({k: str(v) for k, v in (env or {}).items()})
            cmd = [python, "-u", "-m", "launcher.worker", "--spawn", payload_path,
                   os.path.join(tmp, f"result-{rank}.pkl")]
            workers.append(WorkerProcess(cmd, wenv, rank=rank, local_rank=rank, files=files))
        for w in workers:
            w.start(pump, janitor)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            proc.reap(workers, janitor)
            failed = [w for w in workers if w.returncode not in (None, 0)]
            if failed:
                failures = [ProcessFailure(rank=w.rank, local_rank=w.local_rank, pid=w.pid,
                                           exitcode=w.returncode, error_file=w.files.error_file,
                                           observed_at=w.exited_at) for w in failed]
                proc.stop(workers, config.stop_grace(), janitor=janitor, waiter=waiter)
                pump.wait_idle(2.0)
                raise _error(failures)
            if all(w.returncode == 0 for w in workers):
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                pending = [w.rank for w in workers if w.alive()]
                dumps = stacks.collect(((w, w.files.stack_file) for w in workers if w.alive()))
                proc.stop(workers, config.stop_grace(), janitor=janitor, waiter=waiter)
                pump.wait_idle(2.0)
                raise SpawnTimeoutError(timeout, pending, dumps)
            waiter.wait(workers, 1.0 if left is None else min(left, 1.0))
        pump.wait_idle(2.0)
        results = []
        for rank in range(nprocs):
            path = os.path.join(tmp, f"result-{rank}.pkl")
            if os.path.exists(path):  # absent if fn ended with sys.exit(0)
                with open(path, "rb") as f:
                    results.append(cloudpickle.loads(f.read()))
            else:
                results.append(None)
        return results
    finally:
        proc.stop(workers, config.stop_grace(), janitor=janitor, waiter=waiter)
        pump.close()
        waiter.close()
        if server is not None:
            server.close()
        shm.remove_segments(job_id)
        shutil.rmtree(tmp, ignore_errors=True)
        janitor.close()
