"""``npurun`` (= ``python -m launcher``): torchrun's command line for npusim.

Every flag has torchrun's dashed and underscored spellings, and, as in torchrun, its default can
come from ``PET_<FLAG>`` (e.g. ``PET_NPROC_PER_NODE=4``). Precedence for the node layout:
flag > PET_ variable > SLURM (``srun npurun ...``) > built-in default.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from argparse import REMAINDER
from dataclasses import dataclass
from typing import Mapping

from launcher import config, slurm
from launcher.errors import ConfigError, LauncherError

DEFAULT_MULTINODE_PORT = 29500  # torchrun's


def _env_default(dest: str):
    """argparse default from torchrun's PET_<DEST> variable, else None (= not given)."""
    return config.flag_default(dest, None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="npurun",
        description="Start an npusim job: nproc-per-node ranks on this node (torchrun's flags).",
        epilog="Environment of each rank: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
               "GROUP_RANK, ROLE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, "
               "TORCHELASTIC_RUN_ID, RANK_ID, RANK_SIZE, DEVICE_ID, ASCEND_DEVICE_ID, "
               "NPUSIM_JOB_ID, NPUSIM_JOB_SECRET, NPUSIM_NODE_COUNT. See docs/launcher.md.")
    add = p.add_argument
    add("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
        default=_env_default("nproc_per_node"),
        help="ranks on this node: an integer, or 'auto'/'cpu'/'gpu'/'npu' for the CPU count "
             "(default 1)")
    add("--nnodes", dest="nnodes", default=_env_default("nnodes"),
        help="number of nodes, N or N:N (default 1; under SLURM: SLURM_NNODES)")
    add("--node-rank", "--node_rank", dest="node_rank", type=int,
        default=_env_default("node_rank"),
        help="this node's rank in [0, nnodes) (default 0; under SLURM: SLURM_NODEID)")
    add("--master-addr", "--master_addr", dest="master_addr", default=_env_default("master_addr"),
        help="address of node 0, which hosts the job's store (default 127.0.0.1; under SLURM: "
             "the first host of SLURM_JOB_NODELIST)")
    add("--master-port", "--master_port", dest="master_port", type=int,
        default=_env_default("master_port"),
        help="port of the job's store (one node: a free port; several nodes: 29500)")
    add("--standalone", action="store_true", default=bool(_env_default("standalone")),
        help="a single-node job on loopback and a free port (ignores the node flags)")
    add("--run-id", "--run_id", "--rdzv-id", "--rdzv_id", dest="run_id",
        default=_env_default("run_id"),
        help="name of the run (TORCHELASTIC_RUN_ID, log sub-directory; default: the job id)")
    add("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend",
        default=_env_default("rdzv_backend") or "static",
        help="torchrun's rendezvous backend: 'c10d' or 'static' (both use npurun's own store; "
             "with c10d, --rdzv-endpoint gives its host:port)")
    add("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint",
        default=_env_default("rdzv_endpoint"),
        help="HOST[:PORT] of the job's store, as --master-addr/--master-port (port default 29400)")
    add("--rdzv-conf", "--rdzv_conf", dest="rdzv_conf", default=_env_default("rdzv_conf"),
        help="torchrun's KEY=VALUE,... rendezvous options: accepted and ignored "
             "(HCCL_CONNECT_TIMEOUT bounds the rendezvous)")
    add("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter",
        default=_env_default("local_ranks_filter"),
        help="show only these local ranks' output on the console, e.g. 0,2 (log files keep "
             "everything)")
    add("--status", dest="status", nargs="?", const="", metavar="NPURUN_PID",
        help="print the live state of a running npurun job (the newest one, or NPURUN_PID) and "
             "exit; the job keeps running")
    add("--log-dir", "--log_dir", dest="log_dir", default=_env_default("log_dir"),
        help="write <log-dir>/<run-id>/attempt_<k>/<local_rank>/{stdout,stderr}.log, "
             "error.json, stacks.txt")
    add("-r", "--redirects", dest="redirects", default=_env_default("redirects") or "0",
        help="send ranks' streams to the log files only: 0 none, 1 stdout, 2 stderr, 3 both, "
             "or per local rank like 0:3,1:1")
    add("-t", "--tee", dest="tee", default=_env_default("tee") or "0",
        help="copy ranks' streams to the log files and the console (values as --redirects)")
    add("--max-restarts", "--max_restarts", dest="max_restarts", type=int,
        default=int(_env_default("max_restarts") or 0),
        help="restart the whole job up to this many times after a failure (default 0)")
    add("--monitor-interval", "--monitor_interval", dest="monitor_interval", type=float,
        default=float(_env_default("monitor_interval") or 0.1),
        help="seconds between supervision checks (default 0.1; rank exits wake it at once)")
    add("-m", "--module", dest="module", action="store_true",
        default=bool(_env_default("module")),
        help="run the script argument as a module, like python -m")
    add("--no-python", "--no_python", dest="no_python", action="store_true",
        default=bool(_env_default("no_python")),
        help="run the script argument as a program, without python")
    add("--profile", dest="profile", metavar="DIR", default=None,
        help="profile every rank (NPUSIM_PROFILE_DIR=DIR): per-rank traces, a merged timeline "
             "and, at the end, a summary of where the time went (see docs/profiling.md)")
    add("training_script", nargs="?", help="the script (or module, or program) each rank runs")
    add("training_script_args", nargs=REMAINDER, help="its arguments")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@dataclass(frozen=True)
class Layout:
    """Where this node sits in the job, after flags, PET_ variables and SLURM."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int          # 0 = a free port (single node only)
    nproc_per_node: int
    from_slurm: bool = False
    run_id: str | None = None   # under SLURM: slurm-<job>.<step>, when --run-id is not given


RDZV_BACKENDS = ("static", "c10d")
DEFAULT_RDZV_PORT = 29400  # torchrun's c10d default


def _nproc(value: str | None) -> int:
    if value is None:
        return 1
    if value in ("auto", "cpu", "gpu", "npu"):   # one simulated NPU per CPU
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"--nproc-per-node {value!r} is not an integer, 'auto', 'cpu', 'gpu' "
                          f"or 'npu'") from None
    if n < 1:
        raise ConfigError(f"--nproc-per-node {n} must be >= 1")
    return n


def _nnodes(value: str) -> int:
    lo, sep, hi = str(value).partition(":")
    try:
        a, b = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise ConfigError(f"--nnodes {value!r} is not N or N:N") from None
    if a != b:
        raise ConfigError(f"--nnodes {value}: elastic ranges are not supported; use a fixed N")
    if a < 1:
        raise ConfigError(f"--nnodes {value} must be >= 1")
    return a


def _endpoint(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """(host, port) of ``--rdzv-endpoint`` (None, None without one); checks ``--rdzv-backend``."""
    backend = str(getattr(args, "rdzv_backend", None) or "static")
    if backend not in RDZV_BACKENDS:
        raise ConfigError(f"--rdzv-backend {backend!r}: npurun supports 'c10d' and 'static' "
                          f"(both served by npurun's own store)")
    value = getattr(args, "rdzv_endpoint", None)
    if not value:
        return None, None
    host, sep, port = str(value).strip().rpartition(":")
    if not sep:
        host, port = port, ""
    host = host.strip("[]")
    if not host:
        raise ConfigError(f"--rdzv-endpoint {value!r} is not HOST[:PORT]")
    if not port:
        return host, DEFAULT_RDZV_PORT
    if not port.isdigit():
        raise ConfigError(f"--rdzv-endpoint {value!r}: port {port!r} is not a number")
    return host, int(port)


def ranks_filter(value: str | None) -> set[int] | None:
    """``--local-ranks-filter 0,2`` -> {0, 2}; None shows every rank."""
    if value is None or str(value).strip() == "":
        return None
    out = set()
    for item in str(value).split(","):
        if not item.strip().isdigit():
            raise ConfigError(f"--local-ranks-filter {value!r}: {item.strip()!r} is not a "
                              f"local rank (use e.g. 0,2)")
        out.add(int(item))
    return out


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> Layout:
    """The node layout from parsed flags and the environment (SLURM). Raises ConfigError."""
    nproc = _nproc(args.nproc_per_node)
    ep_host, ep_port = _endpoint(args)
    if args.standalone:
        return Layout(1, 0, "127.0.0.1", 0, nproc)
    sl = slurm.defaults(environ)
    from_slurm = sl is not None and (args.nnodes is None or args.node_rank is None
                                     or (args.master_addr or ep_host) is None)
    nnodes = _nnodes(args.nnodes) if args.nnodes is not None else (sl.nnodes if sl else 1)
    node_rank = int(args.node_rank) if args.node_rank is not None else (
        sl.node_rank if sl else 0)
    master_addr = args.master_addr or ep_host or (sl.master_addr if sl else "127.0.0.1")
    if args.master_port is not None:
        port = int(args.master_port)
    elif ep_port is not None:
        port = ep_port
    elif nnodes > 1:
        port = sl.master_port if sl else DEFAULT_MULTINODE_PORT
    else:
        port = 0
    if not 0 <= port <= 65535:
        raise ConfigError(f"--master-port {port} is not a TCP port")
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} is not in [0, {nnodes - 1}] "
                          f"(--nnodes {nnodes})")
    slurm_job = from_slurm and nnodes > 1
    return Layout(nnodes, node_rank, master_addr, port, nproc, slurm_job,
                  sl.run_id if slurm_job and sl.run_id else None)


def _check_entry(args: argparse.Namespace) -> None:
    if not args.training_script:
        raise ConfigError("no training script given (usage: npurun [flags] SCRIPT [ARGS])")
    if not (args.module or args.no_python) and not os.path.isfile(args.training_script):
        raise ConfigError(f"no such script: {args.training_script!r} (use -m for a module, "
                          f"--no-python for a program)")
    if args.module and args.no_python:
        raise ConfigError("-m/--module and --no-python exclude each other")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts {args.max_restarts} must be >= 0")
    if not args.monitor_interval > 0:
        raise ConfigError(f"--monitor-interval {args.monitor_interval} must be > 0")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``npurun``; returns the exit code (0, the root cause's, or 128 + signal)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--status"] or (argv[:1] and argv[0].startswith("--status=")):
        from launcher.diagnosis.status import query_status  # noqa: PLC0415
        rest = [argv[0].partition("=")[2]] if "=" in argv[0] else argv[1:]
        if len(rest) > 1 or (rest and not rest[0].isdigit()):
            print("usage: npurun --status [NPURUN_PID]", file=sys.stderr)
            return 2
        return query_status(int(rest[0]) if rest else None)
    args = parse_args(argv)
    if args.status is not None:     # `npurun --status` after other flags
        from launcher.diagnosis.status import query_status  # noqa: PLC0415
        return query_status(int(args.status) if args.status.isdigit() else None)
    try:
        config.check()     # a knob the ranks would refuse is refused here, with their text
    except ConfigError as e:
        print(f"npurun: error: {e}", file=sys.stderr)
        return 1
    logging.basicConfig(level=[logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]
                        [min(max(config.log_level(), 0), 3)], format="%(asctime)s %(message)s")
    logging.getLogger("launcher").info("npurun: starting (pid %d)", os.getpid())
    # imported here so that `npurun --help` stays fast
    from launcher.agent import Agent, WorkerSpec  # noqa: PLC0415
    from launcher.procs.env import worker_command  # noqa: PLC0415
    from launcher.procs.output import Std  # noqa: PLC0415
    from launcher.rendezvous import LocalRendezvous, NodeRendezvous  # noqa: PLC0415
    try:
        _check_entry(args)
        layout = resolve(args, config.environment())
        spec = WorkerSpec(
            cmd=worker_command(args.training_script, list(args.training_script_args),
                               module=args.module, no_python=args.no_python),
            nproc_per_node=layout.nproc_per_node,
            title=f"npurun {args.training_script}",
            max_restarts=args.max_restarts,
            monitor_interval=args.monitor_interval,
            stop_grace=config.stop_grace(),
            log_dir=args.log_dir,
            redirects=Std.parse(args.redirects, "--redirects"),
            tee=Std.parse(args.tee, "--tee"),
            console_ranks=ranks_filter(args.local_ranks_filter),
        )
        if args.profile:
            spec.base_env["NPUSIM_PROFILE_DIR"] = os.path.abspath(args.profile)
        if layout.nnodes == 1:
            rdzv = LocalRendezvous(master_port=layout.master_port,
                                   nproc_per_node=layout.nproc_per_node, run_id=args.run_id,
                                   max_restarts=args.max_restarts)
        else:
            hint = ("under SLURM, start one npurun per node: srun --ntasks-per-node=1 npurun ..."
                    if layout.from_slurm else "")
            rdzv = NodeRendezvous(nnodes=layout.nnodes, node_rank=layout.node_rank,
                                  master_addr=layout.master_addr, master_port=layout.master_port,
                                  nproc_per_node=layout.nproc_per_node,
                                  run_id=args.run_id or layout.run_id,
                                  max_restarts=args.max_restarts,
                                  timeout=config.connect_timeout(), hint=hint)
        agent = Agent(spec, rdzv)
        from launcher.agent.diagnose import Diagnoser  # noqa: PLC0415
        from launcher.diagnosis.status import register, status_file  # noqa: PLC0415
        diagnoser = Diagnoser(agent, report_dir=args.log_dir)
        registration = None
        try:
            # answer status requests from now on: SIGUSR1's default action would kill npurun
            signal.signal(signal.SIGUSR1, agent.request_status)
            registration = register(os.getpid(), ["npurun", *argv])
        except (OSError, LauncherError):
            pass
        try:
            result = agent.run()
            _merge_traces(agent, args.profile)
        finally:
            diagnoser.finish()
            diagnoser.close()
            if registration:
                for path in (registration, status_file(os.getpid())):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
        return result.exitcode
    except (LauncherError, ValueError) as e:
        print(f"npurun: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"npurun: error: {e}", file=sys.stderr)
        return 1


def _merge_traces(agent, profile: str | None = None) -> None:
    """With --profile or NPUSIM_PROFILE_DIR, merge the ranks' traces into one timeline (one
    process per rank) and print the summary of where the time went."""
    d = profile or config.profile_dir()
    if not d or agent.job is None:
        return
    from launcher.profile.tracemerge import merge  # noqa: PLC0415
    paths = [p for p in (os.path.join(d, f"trace_rank{r}.json")
                         for r in range(agent.job.world_size)) if os.path.exists(p)]
    if paths:
        out = os.path.join(d, "trace_merged.json")
        try:
            merge(paths, out)
            print(f"npurun: merged the traces of {len(paths)} rank(s) into {out} "
                  "(open it in https://ui.perfetto.dev)", file=sys.stderr)
        except (OSError, ValueError) as e:
            print(f"npurun: could not merge the traces in {d}: {e}", file=sys.stderr)
        from launcher.profile.summary import summarize_dir  # noqa: PLC0415
        try:
            print("npurun: " + "\n".join(summarize_dir(d, paths)), file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - the job's result must not depend on its summary
            print(f"npurun: could not summarize the traces in {d}: {type(e).__name__}: {e}",
                  file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
