"""The agent: one per node; starts its ranks, supervises them, stops them, restarts the job.

Data model as torch elastic's (``api``): a ``WorkerSpec`` (what to run, how many, the
policies), a ``Worker`` per local rank with a ``WorkerState``, and a ``RunResult``; how an
attempt's ranks start (files, environment, launch policy, fork server) is ``start``'s. The
state machine:

    join (rendezvous) -> attempt k: start ranks -> HEALTHY
        all ranks exit 0 -> (all nodes done) -> SUCCEEDED
        a rank fails / another node failed / a stop hook fires -> stop the others -> FAILED
            -> remove what attempt k left (its shared-memory segments) -> restart (attempt k+1)
               while k < max_restarts, else exit with the root cause's code
        SIGINT / SIGTERM / SIGHUP -> forward to every rank's group, SIGKILL after the grace
            period -> exit 128 + signal

Hooks for diagnosis (the hang detector plugs in here): ``on_tick`` callables run every monitor
interval and may return a ``StopRequest`` to end the job; ``before_stop`` callables run before
the launcher stops live ranks, while they can still be inspected; ``verdict_hooks`` hand over
the job verdict of the failure, if any: npurun then prints it first and a failure summary that
agrees with it (``diagnosis.summary.format_story``) instead of the first-failure summary.
``collect_stacks()`` takes every live rank's Python stacks now (SIGUSR1, or SIGUSR2 for a rank
stuck in C: no cooperation needed); ``stop_signal``, ``request_status()`` and ``say()`` are public for them.

Every restart is a fresh attempt: its ranks get TORCHELASTIC_RESTART_COUNT=k+1, which names
their communicators' store keys (``hccl/<job>/<k+1>/...``) and diag keys, so nothing the failed
attempt wrote to the store is read again; their transports bind new ephemeral ports; and the
failed attempt's /dev/shm segments are removed before the next starts (on every node before
the restart barrier, so no node removes a segment of the new attempt). A job that restarted
ends with one line per attempt (``attempts``): the culprit and class of each failure and where
the next attempt resumed, as its ranks printed it.

Runs in the main thread: it installs signal handlers, and it forks the ranks from the thread
that lives as long as the launcher (their parent-death signal follows the forking thread).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Callable

from launcher.agent.api import RunResult, StopRequest, Worker, WorkerSpec, WorkerState, say
from launcher.agent.attempts import RESUMED_MARKER, AttemptRecord, failure_class, format_attempts
from launcher.agent.entrycheck import script_problem
from launcher.agent.start import RankStarter
from launcher.diagnosis.report import ranks_text
from launcher.diagnosis.summary import (Culprit, ProcessFailure, format_story, format_summary,
                                        root_cause, story_exit_code)
from launcher.errors import Interrupted, describe_exit, signal_name
from launcher.procs import proc, shm, stacks
from launcher.procs.env import JobInfo
from launcher.procs.janitor import Janitor
from launcher.procs.output import OutputPump, std_for

log = logging.getLogger("launcher")

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Above this many ranks on the console, the ranks' lines after a Ctrl-C (one each, where it
# stopped) are printed grouped by site, and rank lists as ranges: a 256-rank job's screen.
GROUP_AT = 8
INTERRUPT_MARKER = b"KeyboardInterrupt: stopped"
ONE_LINE_MARKER = b" (full traceback: "      # launcher.worker's one-line errors end so


class Agent:
    """Supervises this node's ranks for the whole job (all attempts)."""

    def __init__(self, spec: WorkerSpec, rendezvous):
        self.spec, self.rdzv = spec, rendezvous
        self.job: JobInfo | None = None
        self.workers: list[Worker] = []
        self.attempt = 0
        self.on_tick: list[Callable[["Agent"], StopRequest | None]] = []
        self.before_stop: list[Callable[["Agent", str], None]] = []
        self._signal = 0
        self._signals_seen = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._janitor: Janitor | None = None
        self._pump: OutputPump | None = None
        self._waiter: proc.Waiter | None = None
        self._starter: RankStarter | None = None   # with the fork server and the watcher
        self._log_root: str | None = None
        self._temp_root = False
        self.keep_logs = False          # keep a temporary log root (a verdict points into it)
        self._logs_said = False         # a closing line already said where the logs are
        self.status_requested = False
        # the job verdict of the failure being handled: {"verdict", "text", "path"} or None
        self.verdict_hooks: list[Callable[[], dict | None]] = []
        self.attempts: list[AttemptRecord] = []
        self._interrupt_sites: dict[str, list[int]] = {}   # a big job's Ctrl-C lines, by site
        self._held_lines = 0            # a big job's one-line errors kept off the console

    # -- hooks for diagnosis ---------------------------------------------------------------
    def live_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.alive()]

    def poll_live(self) -> list[Worker]:
        """Reap the ranks that have exited; return the ones still running."""
        self._reap()
        return self.live_workers()

    def collect_stacks(self, timeout: float = 2.0) -> dict[int, str]:
        """Every live rank's Python stacks, now: {rank: text} (see ``launcher.procs.stacks``)."""
        return stacks.collect(((w.proc, w.proc.files.stack_file) for w in self.live_workers()),
                              timeout)

    @property
    def attempt_dir(self) -> str:
        """``<log root>/<run id>/attempt_<k>`` of the current attempt."""
        return os.path.join(self._log_root, self.job.run_id, f"attempt_{self.attempt}")

    # -- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        self._signals_seen += 1
        if not self._signal:
            self._signal = signum
        try:
            os.write(self._wake_w, b"s")
        except OSError:
            pass

    @property
    def stop_signal(self) -> int:
        """The signal that told npurun to stop (SIGINT, SIGTERM, SIGHUP), or 0."""
        return self._signal

    def request_status(self, _signum=None, _frame=None) -> None:
        """Ask for the live status table at the next tick (a SIGUSR1 handler)."""
        self.status_requested = True
        try:
            os.write(self._wake_w, b"u")
        except OSError:
            pass

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        saved = {s: signal.signal(s, self._on_signal) for s in FORWARDED_SIGNALS}
        saved[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self.request_status)
        return saved

    def _stop_signal(self) -> int:
        return self._signal

    # -- the job ---------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run the job to its end; never leaves a process or a shared-memory segment behind."""
        saved = self._install_signals()
        self._janitor = Janitor()
        self._pump = OutputPump()
        self._pump.watch(RESUMED_MARKER, self._saw_resumed)
        self._pump.watch(ONE_LINE_MARKER, self._saw_one_liner)
        self._waiter = proc.Waiter((self._wake_r,))
        self._starter = RankStarter(self.spec, self._pump, self._janitor,
                                    stopping=lambda: bool(self._signal))
        try:
            self.rdzv.should_stop = self._stop_signal
            self.job = self.rdzv.join()
            self._janitor.watch_job(self.job.job_id)
            self._setup_logs()
            problem = script_problem(proc.worker_argv(self.spec.cmd))
            if problem is not None:     # one message, not one per rank
                message = f"{self.spec.cmd[4]} does not compile; no rank was started"
                self.rdzv.report_failure(0, {"node": self.job.node_rank, "rank": None,
                                             "exitcode": 1, "message": message})
                say(f"npurun: {message}:\n{problem}")
                return RunResult(WorkerState.FAILED, 1, 0, message=message)
            while True:
                self.rdzv.begin(self.attempt)
                self.attempts.append(AttemptRecord(self.attempt))
                result = self._run_attempt()
                self._record().outcome = {WorkerState.SUCCEEDED: "succeeded",
                                          WorkerState.FAILED: "failed"}.get(result.state,
                                                                            "stopped")
                if result.state is WorkerState.SUCCEEDED or result.signum:
                    return self._end(result)
                if self._signal:  # told to stop while handling the failure: no restart
                    return self._end(RunResult(WorkerState.STOPPED, 128 + self._signal,
                                               self.attempt, result.failures,
                                               signum=self._signal))
                if self.attempt >= self.spec.max_restarts:
                    return self._end(result)
                removed = shm.remove_segments(self.job.job_id)   # every rank of it is gone
                if removed:
                    log.info("npurun: removed %d segment(s) of attempt %d", len(removed),
                             self.attempt)
                self.attempt += 1
                say(f"npurun: restarting the job: attempt {self.attempt} of at most "
                     f"{self.spec.max_restarts} restarts (TORCHELASTIC_RESTART_COUNT="
                     f"{self.attempt})")
        except Interrupted as e:
            say(f"npurun: {signal_name(e.signum)} received, stopping")
            if self.job is not None:  # waiting at a restart barrier: the other nodes stop too
                self.rdzv.report_failure(self.attempt, {
                    "node": self.job.node_rank, "rank": None, "exitcode": 128 + e.signum,
                    "message": f"npurun on node {self.job.node_rank} received "
                               f"{signal_name(e.signum)}"})
            return RunResult(WorkerState.STOPPED, 128 + e.signum, self.attempt, signum=e.signum)
        finally:
            self._shutdown()
            for s, handler in saved.items():
                signal.signal(s, handler)
            os.close(self._wake_r)  # only now: a late signal must not write to a reused fd
            os.close(self._wake_w)

    # -- attempts ----------------------------------------------------------------------------
    def _record(self) -> AttemptRecord:
        return self.attempts[-1]

    def _saw_one_liner(self, prefix: str, line: str) -> bool:
        """A rank's one-line error (``launcher.worker``: a collective's error or a Ctrl-C,
        ``... (full traceback: PATH)``), in the pump's thread. Above GROUP_AT ranks on the
        console it is kept off it: the failure summary groups the ranks' errors, and
        ``_interrupted`` prints one line per place the ranks stopped at."""
        shown = sum(1 for w in self.workers if w.proc.console)
        rank = prefix.strip()[len("[rank "):-len("]:")]
        if shown <= GROUP_AT or not rank.isdigit():
            return False
        if INTERRUPT_MARKER.decode() in line:
            if not self._signal:
                return False
            site = line.partition(INTERRUPT_MARKER.decode())[2].partition(" (full traceback")[0]
            self._interrupt_sites.setdefault(site.strip(), []).append(int(rank))
        else:
            self._held_lines += 1
        return True

    def _saw_resumed(self, _prefix: str, line: str) -> None:
        """The pump saw a rank print ``resumed from step N`` (in the pump's thread)."""
        if self.attempts:
            self._record().saw_line(line)

    def _failed(self, culprits: list, klass: str, detail: str, at: float) -> None:
        r = self._record()
        r.culprits, r.failure_class, r.detail, r.failed_at = culprits, klass, detail, at

    def _end(self, result: RunResult) -> RunResult:
        """The attempts table, if the job restarted; then ``result``."""
        if len(self.attempts) > 1:
            for r in self.attempts:
                r.scan_logs(os.path.join(self._log_root, self.job.run_id, f"attempt_{r.number}"))
            say(format_attempts(self.attempts, self.spec.max_restarts))
        return result

    def _setup_logs(self) -> None:
        if self.spec.log_dir:
            self._log_root = os.path.abspath(self.spec.log_dir)
        else:
            self._log_root = tempfile.mkdtemp(prefix="npurun-")
            self._temp_root = True
            self._janitor.watch_dir(self._log_root)

    def _keep_temp_logs(self) -> bool:
        redirected = any(std_for(self.spec.redirects, i) or std_for(self.spec.tee, i)
                         for i in range(self.spec.nproc_per_node))
        return self._temp_root and (redirected or self.keep_logs)

    def _start_workers(self) -> None:
        self.workers = self._starter.workers(self.job, self.attempt, self.attempt_dir)
        self._starter.start(self.workers, self.attempt)

    def _reap(self) -> list[Worker]:
        exited = []
        for w in self.workers:
            if w.proc.alive() and w.proc.poll(self._janitor) is not None:
                w.state = WorkerState.SUCCEEDED if w.proc.returncode == 0 else WorkerState.FAILED
                exited.append(w)
        return exited

    def _failure(self, w: Worker) -> ProcessFailure:
        return ProcessFailure(rank=w.rank, local_rank=w.local_rank, pid=w.proc.pid,
                              exitcode=w.proc.returncode, error_file=w.proc.files.error_file,
                              observed_at=w.proc.exited_at)

    def _stop_live(self, reason: str, sig: int = signal.SIGTERM, *,
                   local_failure: bool = False) -> list[int]:
        """Run the ``before_stop`` hooks, then stop the live ranks; the stopped ranks' numbers.

        After a local rank's failure the hooks run even when every rank has exited already: on a
        busy machine all the ranks of a failed collective can be gone before this loop notices
        the first one, and their states and error files still make the verdict.
        """
        live = self.live_workers()
        if not live and not local_failure:
            return []
        for hook in self.before_stop:
            try:
                hook(self, reason)
            except Exception as e:  # a diagnosis bug must not keep ranks running
                say(f"npurun: before_stop hook {hook!r} failed: {e}")
        live = self.live_workers()
        if not live:
            return []
        procs = [w.proc for w in live]
        proc.stop(procs, self.spec.stop_grace, sig, self._janitor, self._waiter,
                  force=lambda: self._signals_seen > 1)
        for w in live:  # a rank may have ended by itself while we were stopping it
            code = w.proc.returncode
            w.state = (WorkerState.STOPPED if code in (-sig, -signal.SIGKILL) else
                       WorkerState.SUCCEEDED if code == 0 else WorkerState.FAILED)
        return [w.rank for w in live if w.state is WorkerState.STOPPED]

    def _run_attempt(self) -> RunResult:
        self._start_workers()
        k = self.attempt
        while True:
            if self._signal:
                return self._interrupted()
            self._reap()
            failed = [w for w in self.workers if w.state is WorkerState.FAILED]
            if failed:
                return self._fail(failed)
            if all(w.state is WorkerState.SUCCEEDED for w in self.workers):
                log.info("npurun: attempt %d: every rank of this node exited 0", k)
                self.rdzv.report_done(k)
                verdict = self.rdzv.wait_verdict(k)
                if verdict.state == "done":
                    self._pump.wait_idle(2.0)
                    return RunResult(WorkerState.SUCCEEDED, 0, k)
                return self._peer_failed(verdict.detail)
            verdict = self.rdzv.poll(k)
            if verdict is not None and verdict.state == "failed":
                return self._peer_failed(verdict.detail)
            for hook in list(self.on_tick):
                try:
                    request = hook(self)
                except Exception as e:  # a diagnosis bug must not end the job: drop the hook
                    say(f"npurun: on_tick hook {hook!r} failed and is removed: {e!r}")
                    self.on_tick.remove(hook)
                    continue
                if request is not None:
                    return self._hook_stop(request)
            self._waiter.wait([w.proc for w in self.workers], self.spec.monitor_interval)

    def _fail(self, failed: list[Worker]) -> RunResult:
        first_seen = root_cause([self._failure(w) for w in failed])
        stopped = self._stop_live(f"rank {first_seen.rank} failed", local_failure=True)
        self._pump.wait_idle(2.0)  # the ranks' last lines come before the summary
        # ranks that failed by themselves meanwhile are failures too, not "stopped by npurun"
        failures = [self._failure(w) for w in self.workers if w.state is WorkerState.FAILED]
        report = self._take_verdict()
        restarting = self.attempt < self.spec.max_restarts
        if report is not None:
            culprits = self._culprits(report["verdict"], failures, stopped)
            code = story_exit_code(culprits)
            names = ", ".join(map(str, report["verdict"]["culprits"])) or "none found"
            message = f"culprit rank(s) {names}: {report['verdict']['verdict']}"
            self._failed(list(report["verdict"]["culprits"] or ()),
                         failure_class(report["verdict"].get("reason"), 1),
                         _first_line(report["verdict"].get("verdict")),
                         min(f.timestamp for f in failures) if failures else time.time())
            first = self.rdzv.report_failure(self.attempt, {
                "node": self.job.node_rank, "rank": culprits[0].rank if culprits else None,
                "exitcode": code, "message": message})
            self._print_story(report, culprits, failures, restarting)
        else:
            root = root_cause(failures)
            code = root.shell_exitcode
            self._failed([root.rank], failure_class(None, root.exitcode),
                         describe_exit(root.exitcode), root.timestamp)
            first = self.rdzv.report_failure(self.attempt, {
                "node": self.job.node_rank, "rank": root.rank, "exitcode": code,
                "message": f"rank {root.rank} failed ({describe_exit(root.exitcode)}): "
                           f"{root.message}"})
            say(format_summary(self._title(), failures, stopped,
                               keep_files=not self._temp_root or self._keep_temp_logs(),
                               restarting=restarting))
            self._say_held()
        if first.get("node") != self.job.node_rank:
            say(f"npurun: note: node {first.get('node')} failed first: {first.get('message')}")
        return RunResult(WorkerState.FAILED, code, self.attempt, failures)

    def _title(self) -> str:
        return self.spec.title + (f" (attempt {self.attempt})" if self.spec.max_restarts else "")

    def _take_verdict(self) -> dict | None:
        for hook in self.verdict_hooks:
            report = hook()
            if report:
                return report
        return None

    def _culprits(self, v: dict, failures: list[ProcessFailure], stopped: list[int]) -> list:
        local = {w.rank: w for w in self.workers}
        failed = {f.rank: f for f in failures}
        out = []
        for c in v.get("culprits") or ():
            e = v["ranks"].get(str(c)) or {}
            w = local.get(c)
            state = "in the deadlock cycle" if v.get("reason") == "deadlock" else e.get("state")
            out.append(Culprit(rank=c, state=state or "?", detail=e.get("detail") or (
                f"waits for rank {e.get('waiting_for')}" if e.get("waiting_for") is not None
                else ""),
                local_rank=w.local_rank if w else None, pid=w.proc.pid if w else None,
                exitcode=w.proc.returncode if w else None, stopped=c in stopped,
                failure=failed.get(c)))
        return out

    def _print_story(self, report: dict, culprits: list, failures: list, restarting: bool):
        """The verdict first, then the summary that agrees with it (see ``format_story``)."""
        self.keep_logs = True           # the ranks' tracebacks live there
        where = os.path.join(self.attempt_dir, "<local_rank>", "traceback.log")
        say(report["text"])
        say(format_story(self._title(), report["verdict"]["reason"], culprits, failures,
                         tracebacks=where, restarting=restarting))
        say(f"npurun: hang report written to {report['path']}")
        self._say_held()

    def _say_held(self) -> None:
        if self._held_lines:
            say(f"npurun: the one-line errors of {self._held_lines} ranks were kept off the "
                "console: the summary above groups them")
            self._held_lines = 0

    def _peer_failed(self, detail: dict) -> RunResult:
        self._failed([detail["rank"]] if detail.get("rank") is not None else [],
                     f"node {detail.get('node')}", _first_line(detail.get("message")),
                     time.time())
        stopped = self._stop_live(f"node {detail.get('node')} failed")
        self._pump.wait_idle(2.0)
        say(f"npurun: node {self.job.node_rank}: stopping: node {detail.get('node')} failed: "
             f"{detail.get('message')}"
             + ("" if detail.get("lost") else " (see that node's summary)")
             + (f"; stopped ranks {', '.join(map(str, stopped))}" if stopped else ""))
        return RunResult(WorkerState.FAILED, int(detail.get("exitcode") or 1), self.attempt,
                         message=str(detail.get("message")))

    def _hook_stop(self, request: StopRequest) -> RunResult:
        self._failed([], "stopped", _first_line(request.message), time.time())
        self.rdzv.report_failure(self.attempt, {"node": self.job.node_rank, "rank": None,
                                                "exitcode": request.exitcode,
                                                "message": request.message})
        say(f"npurun: stopping the job: {request.message}")
        stopped = self._stop_live(request.message)
        self._pump.wait_idle(2.0)
        failures = [self._failure(w) for w in self.workers if w.state is WorkerState.FAILED]
        report = self._take_verdict()
        if report is not None:
            culprits = self._culprits(report["verdict"], failures, stopped)
            self._print_story(report, culprits, failures, restarting=False)
        else:
            say(f"npurun: stopped the job: {request.message}"
                + (f" (stopped ranks {', '.join(map(str, stopped))})" if stopped else ""))
        return RunResult(WorkerState.FAILED, request.exitcode, self.attempt, failures,
                         message=request.message)

    def _interrupted(self) -> RunResult:
        """Forward the signal; the console then gets one line per rank (its own, where it was)
        and this one closing line."""
        sig = self._signal
        self.rdzv.report_failure(self.attempt, {
            "node": self.job.node_rank, "rank": None, "exitcode": 128 + sig,
            "message": f"npurun on node {self.job.node_rank} received {signal_name(sig)}"})
        live = [w.rank for w in self.live_workers()]
        self._stop_live(f"{signal_name(sig)} received", sig)
        self._pump.wait_idle(2.0)
        killed = [w.rank for w in self.workers if w.proc.returncode == -signal.SIGKILL]
        self.keep_logs = self._logs_said = True       # the ranks' lines point into them
        for site, ranks in sorted(self._interrupt_sites.items(), key=lambda kv: -len(kv[1])):
            say(f"npurun: KeyboardInterrupt: {ranks_text(ranks)} stopped "
                f"{site or 'outside their code'}")
        big = len(self.workers) > GROUP_AT         # a list of 256 numbers is not read
        say(f"npurun: {signal_name(sig)} received: stopped "
            + ((ranks_text(live) if live else "no rank") if big else f"rank(s) {live or 'none'}")
            + f" (forwarded {signal_name(sig)}"
            + (f"; SIGKILL after {self.spec.stop_grace:g} s: "
               + (ranks_text(killed) if big else str(killed)) if killed else "")
            + f"); exits with {128 + sig}; tracebacks in "
            f"{os.path.join(self.attempt_dir, '<local_rank>', 'traceback.log')}")
        return RunResult(WorkerState.STOPPED, 128 + sig, self.attempt, signum=sig)

    def _shutdown(self) -> None:
        """Whatever happened: no rank, no segment, no temp dir, no store left behind."""
        try:
            if self._starter is not None:
                self._starter.close_watcher()
            if self.workers:
                self._stop_live("npurun is exiting", signal.SIGTERM)
        finally:
            if self._starter is not None:   # after the ranks: their parent-death signal
                self._starter.close_server()
            if self._pump is not None:
                self._pump.close()
            if self.job is not None:
                shm.remove_segments(self.job.job_id)
            try:
                self.rdzv.close()
            except Exception as e:
                say(f"npurun: closing the rendezvous: {e}")
            if self._temp_root and self._log_root:
                if self._keep_temp_logs():
                    if not self._logs_said:
                        say(f"npurun: logs kept in {self._log_root} (no --log-dir given)")
                else:
                    shutil.rmtree(self._log_root, ignore_errors=True)
            if self._waiter is not None:
                self._waiter.close()
            if self._janitor is not None:
                self._janitor.close()


def _first_line(text) -> str:
    return (str(text or "").strip().splitlines() or [""])[0]     # whole: the attempts line
