"""The environment of a worker (torchrun's names, Ascend's names, npusim's own) and its command."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from launcher import config
from launcher.procs.proc import LogFiles
from runtime import sched

# the directory that holds the launcher, hccl and runtime packages: workers must import them
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class JobInfo:
    """What every node of a job agreed on (``launcher.rendezvous``) plus this node's place."""

    job_id: str
    run_id: str
    secret: str
    master_addr: str
    master_port: int
    nnodes: int
    node_rank: int
    nproc_per_node: int
    max_restarts: int = 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank


def _python_path(base: Mapping[str, str]) -> str:
    parts = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    if PACKAGE_ROOT not in parts:
        parts.append(PACKAGE_ROOT)  # last: the user's own path entries win
    return os.pathsep.join(parts)


def worker_env(base: Mapping[str, str], job: JobInfo, local_rank: int, restart_count: int,
               files: LogFiles, launcher_pid: int | None = None) -> dict[str, str]:
    """The full environment of one worker: ``base`` (the launcher's) plus the job's variables."""
    rank = job.global_rank(local_rank)
    env = dict(base)
    env.update({
        # torchrun
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(job.world_size),
        "LOCAL_WORLD_SIZE": str(job.nproc_per_node),
        "GROUP_RANK": str(job.node_rank),
        "GROUP_WORLD_SIZE": str(job.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(job.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": job.master_addr,
        "MASTER_PORT": str(job.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
        "TORCHELASTIC_RUN_ID": job.run_id,
        "TORCHELASTIC_ERROR_FILE": files.error_file,
        # Ascend
        "RANK_ID": str(rank),
        "RANK_SIZE": str(job.world_size),
        "DEVICE_ID": str(local_rank),
        "ASCEND_DEVICE_ID": str(local_rank),
        # npusim
        "NPUSIM_JOB_ID": job.job_id,
        "NPUSIM_JOB_SECRET": job.secret,
        "NPUSIM_NODE_COUNT": str(job.nnodes),
        # the node this npurun runs (a node is npurun's): ranks of other nodes are reached over the network
        # even on this machine (runtime.ipc.node_id)
        "NPUSIM_NODE": f"{job.job_id}/{job.node_rank}",
        "NPUSIM_STACK_FILE": files.stack_file,
        "NPUSIM_DIAG": "1",      # ranks publish their collective state for the job verdict
        "NPUSIM_FLIGHT_FILE": os.path.join(files.dir, "flight_recorder.json"),
        "NPUSIM_LAUNCHER_PID": str(launcher_pid or os.getpid()),
        # the cores the node's ranks share, which a rank bound to one of them cannot see
        # (runtime.sched.node_cores: hccl's waiters spin by ranks per core)
        "NPUSIM_NODE_CORES": str(sched.cores()),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": _python_path(base),
    })
    if job.nproc_per_node > 1 and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = "1"  # as torchrun: N ranks on one node must not oversubscribe
    if config.user_device_count() is None and job.nproc_per_node > 8:
        env["NPUSIM_DEVICE_COUNT"] = str(job.nproc_per_node)  # one simulated NPU per local rank
    return env


def worker_command(script: str, script_args: list[str], *, module: bool = False,
                   no_python: bool = False, python: str | None = None) -> list[str]:
    """The command line of a worker: the bootstrap (``launcher.worker``) then the user's entry.

    Never carries the job's secret: that travels in the environment only.
    """
    python = python or config.python_exec()
    boot = [python, "-u", "-m", "launcher.worker"]
    if no_python:
        return boot + ["--exec", script, *script_args]
    if module:
        return boot + ["-m", script, *script_args]
    return boot + [script, *script_args]
