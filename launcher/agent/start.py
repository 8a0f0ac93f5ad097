"""How an attempt's ranks start on this node: their files and environment, the launch policy
(SCHED_BATCH, cores: ``schedwatch``), and the node's fork server, with fresh interpreters
whenever it is off, fails to start, or dies.

``RankStarter`` lives as long as the agent: the fork server and the policy's watcher serve
every attempt (a new server replaces one that died). All forks come first and are awaited
after (``ForkServer.request``), so the ranks' interpreters start in parallel.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

from launcher import config
from launcher.agent import schedwatch
from launcher.agent.api import Worker, WorkerSpec, WorkerState, say
from launcher.agent.entrycheck import preload_for
from launcher.procs import proc
from launcher.procs.env import JobInfo, worker_env
from launcher.procs.forkclient import ForkServer, ForkServerError
from launcher.procs.janitor import Janitor
from launcher.procs.output import OutputPump, std_for
from launcher.procs.proc import LogFiles, WorkerProcess
from runtime import sched

log = logging.getLogger("launcher")


class RankStarter:
    """Starts this node's ranks, attempt after attempt; owns the fork server and the watcher."""

    def __init__(self, spec: WorkerSpec, pump: OutputPump, janitor: Janitor,
                 stopping: Callable[[], bool]):
        self.spec, self.pump, self.janitor = spec, pump, janitor
        self.stopping = stopping        # True once npurun was told to stop (a signal)
        self.server = None              # the node's fork server (procs.forkclient), if any
        self.watcher = None             # schedwatch.Watcher, if the policy watches

    def workers(self, job: JobInfo, attempt: int, attempt_dir: str) -> list[Worker]:
        """The workers of ``attempt`` on this node, not started yet (their log files, under
        ``attempt_dir``, are fresh: a reused --run-id never reads an old run's files)."""
        spec, workers = self.spec, []
        for local_rank in range(spec.nproc_per_node):
            files = LogFiles(os.path.join(attempt_dir, str(local_rank)))
            os.makedirs(files.dir, exist_ok=True)
            for stale in (files.error_file, files.stack_file, files.traceback_file):
                if os.path.exists(stale):
                    os.unlink(stale)
            env = worker_env(spec.base_env, job, local_rank, attempt, files)
            wp = WorkerProcess(spec.cmd, env, rank=job.global_rank(local_rank),
                               local_rank=local_rank, files=files,
                               redirect=std_for(spec.redirects, local_rank),
                               tee=std_for(spec.tee, local_rank),
                               console=spec.console_ranks is None
                               or local_rank in spec.console_ranks)
            workers.append(Worker(local_rank, wp.rank, wp))
        return workers

    def start(self, workers: list[Worker], attempt: int) -> None:
        """Start ``workers`` (each HEALTHY once started), unless npurun is told to stop while
        the fork server starts."""
        n = self.spec.nproc_per_node
        policy = schedwatch.policy(n)
        batch, bind = policy.batch, policy.bind
        if attempt == 0:
            if policy.announce():
                say(policy.announce())
            self.watcher = schedwatch.start(policy)
        server = self.fork_server(workers[0].proc.env)
        if self.stopping():         # Ctrl-C while the fork server started: no rank to start
            return
        if self.watcher is not None:    # crowded ranks start in the watcher's state
            quiet = self.watcher.first([server.pid] if server is not None else []) \
                if attempt == 0 else self.watcher.quiet
            if quiet:
                batch, bind = batch or policy.watch_batch, bind or policy.watch_bind
        with sched.spawning(batch):   # Linux children inherit class and affinity (runtime/sched.py)
            # all forks first, then the interpreters start in parallel; with a fork server,
            # every rank is asked for before any answer is awaited (ForkServer.request)
            asked = []
            for w in workers:
                core = sched.core_of(w.local_rank, n) if bind else None
                with sched.pinned(core):
                    try:
                        w.proc.start(self.pump, self.janitor, server,
                                     {"core": core, "batch": batch}, wait=False)
                        asked.append(w)
                        continue
                    except ForkServerError as e:    # it died: its ranks die with it
                        say(f"npurun: {e}; rank {w.rank} and the next start in fresh "
                            "interpreters")
                        server = None
                        w.proc.start(self.pump, self.janitor)
                w.state = WorkerState.HEALTHY
            for w in asked:
                try:
                    w.proc.finish_start()
                except ForkServerError as e:
                    if server is not None:
                        say(f"npurun: {e}; rank {w.rank} and the ranks not yet forked start "
                            "in fresh interpreters")
                        server = None
                    with sched.pinned(sched.core_of(w.local_rank, n) if bind else None):
                        w.proc.start(self.pump, self.janitor)
                w.state = WorkerState.HEALTHY
        if self.watcher is not None:
            self.watcher.follow([(w.local_rank, w.proc.pid) for w in workers],
                                [server.pid] if server is not None else [])
        log.info("npurun: attempt %d: started ranks %s (pids %s)", attempt,
                 [w.rank for w in workers], [w.proc.pid for w in workers])

    def fork_server(self, env: dict):
        """The node's fork server (started once, again after it died; ``env``: a rank's), or
        None: turned off (NPUSIM_FORKSERVER=0), or it failed to start (then fresh
        interpreters, said once)."""
        if self.server is not None and self.server.usable():
            return self.server
        if self.server is not None:
            say(f"npurun: the fork server (pid {self.server.pid}) died; starting a new one")
            self.server.close()
            self.server = None
        if not config.fork_server() or proc.worker_argv(self.spec.cmd) is None:
            return None
        try:
            self.server = ForkServer(self.spec.cmd[0], env, self.janitor,
                                     should_stop=self.stopping,
                                     preload=preload_for(proc.worker_argv(self.spec.cmd)),
                                     title_room=sum(len(os.fsencode(a)) + 1
                                                    for a in self.spec.cmd))
        except (ForkServerError, OSError) as e:
            if not self.stopping():
                say(f"npurun: no fork server ({e}); each rank starts in a fresh interpreter "
                    "(NPUSIM_FORKSERVER=0 says so in advance)")
            return None
        log.info("npurun: fork server pid %d imported %d modules in %.2f s", self.server.pid,
                 len(self.server.preloaded), self.server.import_seconds)
        return self.server

    def close_watcher(self) -> None:
        """Stop the watcher (before the ranks stop: it must not move a dying rank)."""
        if self.watcher is not None:
            self.watcher.close()

    def close_server(self) -> None:
        """Close the fork server (after the ranks: their parent-death signal)."""
        if self.server is not None:
            self.server.close()
