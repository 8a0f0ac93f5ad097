"""npurun's side of hang diagnosis: gather every rank's state, print ONE verdict, keep it as JSON.

Plugs into the agent (``launcher.agent``): a ``before_stop`` hook runs on the first failure while
the other ranks are still alive. It

1. tells every live rank, through the job's store, that rank N failed (``hccl.diag`` aborts
   their communicators, so ranks waiting for a dead peer fail in seconds, naming it);
2. gives the ranks a moment to publish their final state, then reads every rank's state from the
   store (one store serves every node) and takes the local ranks' Python stacks (SIGUSR1 +
   faulthandler, no cooperation needed);
3. classifies every rank (``launcher.verdict``), writes ``hang_report.json`` to the log dir
   (``--log-dir``, else the current directory) and keeps the report text for the agent to print
   after the failure summary.

It only reports when collectives were involved: a plain exception outside any collective gets
the usual failure summary alone. ``status()`` gives the same table for a running job (SIGUSR1 to
npurun, or ``npurun --status``).
"""
from __future__ import annotations

import json
import os
import time

from launcher import verdict
from launcher.summary import read_error_file

SETTLE = 5.0          # at most this long for live ranks to publish a state newer than the failure
EXIT_GRACE = 1.5      # then at most this long (within SETTLE) for released ranks to exit


def _error_text(path: str) -> str | None:
    data = read_error_file(path)
    if not data:
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message")
    return str(msg).splitlines()[0] if msg else None


class Diagnoser:
    """One per agent; see the module note."""

    def __init__(self, agent, report_dir: str | None):
        self.agent = agent
        self.report_dir = report_dir or os.getcwd()
        self.report_text: str | None = None
        self.report_path: str | None = None
        self._client = None
        agent.before_stop.append(self.before_stop)
        agent.on_tick.append(self.on_tick)
        agent.after_summary.append(self.take_report)

    # -- store ------------------------------------------------------------------------------
    def client(self):
        if self._client is None:
            from hccl.store import StoreClient  # noqa: PLC0415 - keeps `import launcher` light
            job = self.agent.job
            self._client = StoreClient(job.master_addr, job.master_port, bytes.fromhex(job.secret),
                                       timeout=5.0)
        return self._client

    def _env(self) -> dict:
        return {"NPUSIM_JOB_ID": self.agent.job.job_id,
                "TORCHELASTIC_RESTART_COUNT": str(self.agent.attempt)}

    def states(self) -> dict[int, dict]:
        from hccl.diag import state_key  # noqa: PLC0415
        out = {}
        c = self.client()
        env = self._env()
        for r in range(self.agent.job.world_size):
            key = state_key(r, env)
            try:
                if c.check([key]):
                    out[r] = json.loads(c.get(key, timeout=2.0))
            except Exception:   # a missing or unreadable state is reported as such
                continue
        return out

    # -- the verdict ------------------------------------------------------------------------
    def infos(self, states: dict, stacks: dict) -> list[verdict.RankInfo]:
        local = {w.rank: w for w in self.agent.workers}
        infos = []
        for r in range(self.agent.job.world_size):
            w = local.get(r)
            exit_code = error = None
            if w is not None and not w.proc.alive():
                exit_code = w.proc.returncode
                error = _error_text(w.proc.files.error_file)
            infos.append(verdict.RankInfo(r, states.get(r), exit_code, error, stacks.get(r)))
        return infos

    def before_stop(self, agent, reason: str) -> None:
        if agent._signal:          # the user asked to stop: no verdict needed
            return
        states = self.states()
        failed = sorted((w for w in agent.workers if not w.proc.alive() and w.proc.returncode),
                        key=lambda w: (w.proc.exited_at or 0, w.rank))
        if not any(s.get("in_flight") or s.get("failed") for s in states.values()):
            return                 # no collective involved: the failure summary says it all
        t0 = time.time()
        agent.poll_live()                    # a rank that has exited since is not asked
        stacks = agent.collect_stacks(2.0)   # before the abort below releases the waiting ranks
        if failed:
            from hccl.diag import abort_key  # noqa: PLC0415
            w = failed[0]
            what = verdict.describe_exit(w.proc.returncode)
            err = _error_text(w.proc.files.error_file)
            try:
                self.client().set(abort_key(self._env()),
                                  f"rank {w.rank} {what}" + (f": {err}" if err else ""))
            except Exception:
                pass
        self._settle(t0)
        states = self.states()
        v = verdict.classify(self.infos(states, stacks))
        self.report_text = verdict.format_report(v)
        os.makedirs(self.report_dir, exist_ok=True)
        self.report_path = os.path.join(self.report_dir, "hang_report.json")
        with open(self.report_path, "w") as f:
            json.dump(v, f, indent=1, default=str)
        self.report_text += f"\nnpurun: hang report written to {self.report_path}"

    def take_report(self) -> str | None:
        """The report of the failure just handled (once)."""
        text, self.report_text = self.report_text, None
        return text

    def _settle(self, t0: float) -> None:
        """Wait until every live rank published a state newer than ``t0``, then until the ranks
        the abort released have exited (at most SETTLE s in all)."""
        deadline = t0 + SETTLE
        while time.time() < deadline:
            live = {w.rank for w in self.agent.poll_live()}
            states = self.states()
            if all(states.get(r, {}).get("time", 0) > t0 for r in live):
                break
            time.sleep(0.1)
        # A released rank raises RemoteRankError naming the culprit and exits by itself within
        # moments: let it, so that its error reaches the log and the summary instead of being
        # cut short by the SIGTERM that stops the job. A rank still in user code stays alive
        # and is stopped after the grace.
        end = min(deadline, time.time() + EXIT_GRACE)
        while time.time() < end and self.agent.poll_live():
            time.sleep(0.05)

    def status(self) -> str:
        """The verdict table of a running job (no stacks, nothing stopped)."""
        v = verdict.classify(self.infos(self.states(), {}))
        return verdict.format_report(v, stacks=False).replace(
            "npusim job verdict", f"npusim job status (attempt {self.agent.attempt}, live view)", 1)

    def on_tick(self, agent):
        """Answer a status request (SIGUSR1 to npurun): print the table, write the status file."""
        if not agent.status_requested:
            return None
        agent.status_requested = False
        try:
            text = self.status()
        except Exception as e:
            text = f"npurun: status unavailable: {e}"
        from launcher.agent import _say  # noqa: PLC0415
        _say(text)
        path = status_file(os.getpid())
        tmp = f"{path}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
        return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def status_file(pid: int) -> str:
    """Where npurun ``pid`` writes its live status table (user-private directory)."""
    from launcher.secret import _secure_dir  # noqa: PLC0415
    return os.path.join(_secure_dir(), f"npurun-{pid}.status")


def query_status(pid: int | None, timeout: float = 10.0) -> int:
    """``npurun --status [PID]``: ask a running npurun for its table and print it."""
    import glob  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from launcher.secret import _secure_dir  # noqa: PLC0415
    if pid is None:
        pids = []
        for path in glob.glob(os.path.join(_secure_dir(), "npurun-*.job")):
            p = int(os.path.basename(path)[7:-4])
            try:
                os.kill(p, 0)
                pids.append(p)
            except OSError:
                pass
        if not pids:
            print("npurun --status: no running npurun job of yours was found", file=sys.stderr)
            return 1
        pid = max(pids)
    if not os.path.exists(os.path.join(_secure_dir(), f"npurun-{pid}.job")):
        print(f"npurun --status: {pid} is not a running npurun of yours (or it is still starting)",
              file=sys.stderr)
        return 1
    path = status_file(pid)
    before = os.stat(path).st_mtime_ns if os.path.exists(path) else 0
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as e:
        print(f"npurun --status: cannot signal npurun {pid}: {e}", file=sys.stderr)
        return 1
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.stat(path).st_mtime_ns != before:
            with open(path) as f:
                sys.stdout.write(f.read())
            return 0
        time.sleep(0.05)
    print(f"npurun --status: npurun {pid} did not answer within {timeout:g} s", file=sys.stderr)
    return 1


def register(pid: int) -> str:
    """Mark npurun ``pid`` as running (for ``npurun --status`` without a pid)."""
    from launcher.secret import _secure_dir  # noqa: PLC0415
    path = os.path.join(_secure_dir(), f"npurun-{pid}.job")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(str(pid))
    return path
