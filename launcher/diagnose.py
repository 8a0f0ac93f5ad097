"""npurun's side of hang diagnosis: gather every rank's state, print ONE verdict, keep it as JSON.

Plugs into the agent (``launcher.agent``): a ``before_stop`` hook runs on the first failure while
the other ranks are still alive. It

1. takes the local ranks' Python stacks (SIGUSR1 + faulthandler, no cooperation needed) and
   reads every rank's state from the store (one store serves every node);
2. tells every live rank, through the job's store, that the job stops and why (a typed abort
   record naming the culprit: ``hccl.diag`` aborts their communicators, so ranks waiting for a
   dead peer fail in seconds, naming it);
3. gives the ranks a moment to publish their final state, classifies every rank
   (``launcher.verdict``), writes ``hang_report.json`` to the log dir (``--log-dir``, else the
   current directory) and keeps the verdict for the agent, which prints it first and builds the
   failure summary from it.

While the job runs, ``on_tick`` polls the states about once a second (node 0's npurun only):

- a wait-for cycle that stays the same for NPUSIM_DEADLOCK_STABLE seconds (default 3) is a
  deadlock: the job is stopped at once with a ``deadlock`` verdict, whatever HCCL_EXEC_TIMEOUT is;
- a collective waiting longer than NPUSIM_HANG_NOTICE seconds (default 60) without progress
  makes npurun print the live status once (who waits, who has not entered, the likely culprit);
  the job keeps running.

It only reports when collectives were involved: a plain exception outside any collective gets
the usual failure summary alone. ``status()`` gives the same table for a running job (SIGUSR1 to
npurun, or ``npurun --status``).
"""
from __future__ import annotations

import json
import os
import time

from launcher import config, verdict
from launcher.errors import describe_exit
from launcher.summary import read_error_file

SETTLE = 5.0          # at most this long for live ranks to publish a state newer than the failure
EXIT_GRACE = 1.5      # then at most this long (within SETTLE) for released ranks to exit
POLL = 1.0            # seconds between two reads of the states while the job runs


def _error(path: str) -> tuple[dict | None, str | None]:
    """(typed error record, traceback) of a rank's error file."""
    data = read_error_file(path)
    if not data:
        return None, None
    rec = data.get("error") if isinstance(data.get("error"), dict) else None
    msg = data.get("message")
    tb = msg.get("extraInfo", {}).get("py_callstack") if isinstance(msg, dict) else None
    if rec is None:         # an error file written by something else than launcher.worker
        text = msg.get("message") if isinstance(msg, dict) else msg
        rec = {"kind": "exception", "type": "Error", "text": str(text or "").splitlines()[0]
               if text else ""}
    return rec, tb


def describe(entry: dict) -> str:
    """A dead rank's verdict line without its error text (``killed by SIGKILL; it was in ...``)."""
    return describe_exit(entry.get("exit"))


class Diagnoser:
    """One per agent; see the module note."""

    def __init__(self, agent, report_dir: str | None):
        self.agent = agent
        self.report_dir = report_dir or os.getcwd()
        self.report: dict | None = None
        self._client = None
        self._next_poll = 0.0
        self._cycle_key = None
        self._cycle_since = 0.0
        self._cycle: list | None = None
        self._noticed: set = set()
        self.notice_after = config.hang_notice()
        self.stable_for = config.deadlock_stable()
        agent.before_stop.append(self.before_stop)
        agent.on_tick.append(self.on_tick)
        agent.verdict_hooks.append(self.take_report)

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
            exit_code = error = tb = None
            if w is not None and not w.proc.alive():
                exit_code = w.proc.returncode
                error, tb = _error(w.proc.files.error_file)
            infos.append(verdict.RankInfo(r, states.get(r), exit_code, error, stacks.get(r), tb,
                                          alive=w is not None and w.proc.alive()))
        return infos

    def _collective_failed(self) -> bool:
        """A local rank exited with a collective's error (its error file's typed kind): a verdict
        is due even if the rank's last state did not reach the store in time."""
        for w in self.agent.workers:
            if not w.proc.alive():
                rec, _ = _error(w.proc.files.error_file)
                if rec is not None and rec.get("kind") not in (None, "exception"):
                    return True
        return False

    def before_stop(self, agent, reason: str) -> None:
        if agent.stop_signal:          # the user asked to stop: no verdict needed
            return
        states = self.states()
        if not (any(s.get("in_flight") or s.get("failed") for s in states.values())
                or self._collective_failed()):
            return                 # no collective involved: the failure summary says it all
        t0 = time.time()
        agent.poll_live()                    # a rank that has exited since is not asked
        stacks = agent.collect_stacks(2.0)   # before the abort below releases the waiting ranks
        cycle = self._cycle if self._cycle_stable() else None
        first = verdict.classify(self.infos(states, stacks), cycle=cycle)
        self._abort_all(first)
        self._settle(t0)
        v = verdict.classify(self.infos(self.states(), stacks), cycle=cycle)
        os.makedirs(self.report_dir, exist_ok=True)
        path = os.path.join(self.report_dir, "hang_report.json")
        with open(path, "w") as f:
            json.dump(v, f, indent=1, default=str)
        self.report = {"verdict": v, "text": verdict.format_report(v), "path": path}

    def _abort_all(self, v: dict) -> None:
        """Release every live rank with a typed record naming the culprit (``hccl.diag``)."""
        from hccl import abortrec  # noqa: PLC0415
        from hccl.diag import abort_key  # noqa: PLC0415
        culprits = v.get("culprits") or []
        dead = [c for c in culprits if v["ranks"].get(str(c), {}).get("state") == "dead"]
        # short: every released rank prints it in its one-line error; npurun's report has the rest
        if v.get("reason") == "deadlock":
            rec = abortrec.record("deadlock", culprits[0] if culprits else None,
                                  f"npurun stops the job: deadlock of ranks {culprits} across "
                                  "communicators (see npurun's report)")
        elif dead:
            e = v["ranks"][str(dead[0])]
            rec = abortrec.record("dead", dead[0], f"rank {dead[0]} {describe(e)}")
        else:
            rec = abortrec.record("stopped", culprits[0] if culprits else None,
                                  f"npurun stops the job: culprit rank(s) {culprits} "
                                  "(see npurun's report)")
        try:
            self.client().set(abort_key(self._env()), rec)
        except Exception:
            pass

    def take_report(self) -> dict | None:
        """The verdict of the failure just handled (once): {"verdict", "text", "path"}."""
        report, self.report = self.report, None
        return report

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

    # -- while the job runs -----------------------------------------------------------------
    def _cycle_stable(self) -> bool:
        return (self._cycle is not None
                and time.time() - self._cycle_since >= self.stable_for)

    def watch(self, now: float | None = None):
        """One poll of the running job: track a wait-for cycle, print the early notice.

        Returns a ``StopRequest`` once a cycle has been stable for NPUSIM_DEADLOCK_STABLE s.
        """
        now = time.time() if now is None else now
        infos = self.infos(self.states(), {})
        cycle = verdict.find_cycle(infos)
        key = verdict.cycle_key(cycle)
        if key != self._cycle_key:
            self._cycle_key, self._cycle, self._cycle_since = key, cycle, now
        elif cycle is not None:
            self._cycle = cycle
            if now - self._cycle_since >= self.stable_for:
                from launcher.agent import StopRequest  # noqa: PLC0415
                ranks = sorted({e["rank"] for e in cycle})
                return StopRequest(f"deadlock: ranks {ranks} wait for each other across "
                                   f"communicators (stable for {now - self._cycle_since:.0f} s)")
        if self.notice_after > 0:
            self._notice(infos, now)
        return None

    def _notice(self, infos: list[verdict.RankInfo], now: float) -> None:
        """Print the live status once per collective that waits too long without progress."""
        longest = None
        for info in infos:
            for r in (info.state or {}).get("in_flight") or ():
                since = r.get("waiting_since") or r.get("t_started")
                if r.get("state") == "started" and since and r.get("peer") is None:
                    if longest is None or since < longest[1]:
                        longest = (info.rank, since, r)
        if longest is None or now - longest[1] < self.notice_after:
            return
        rank, since, r = longest
        key = (r.get("comm_id"), r.get("seq"))
        if key in self._noticed:
            return
        self._noticed.add(key)
        v = verdict.classify(infos, now=now)
        head = (f"npurun: notice: rank {rank} has waited {now - since:.0f} s without progress in "
                f"{verdict.describe_call(r)} seq {r.get('seq')} of {r.get('comm')} "
                f"(NPUSIM_HANG_NOTICE={self.notice_after:g}); the job keeps running until "
                "HCCL_EXEC_TIMEOUT. Live status:")
        from launcher.agent import say  # noqa: PLC0415
        say(head + "\n" + self._live(v))

    def _live(self, v: dict) -> str:
        return verdict.format_report(v, stacks=False).replace(
            "npusim job verdict", f"npusim job status (attempt {self.agent.attempt}, live view)", 1)

    def status(self) -> str:
        """The verdict table of a running job (no stacks, nothing stopped)."""
        return self._live(verdict.classify(self.infos(self.states(), {})))

    def on_tick(self, agent):
        """Answer a status request (SIGUSR1 to npurun); about once a second, ``watch``."""
        if agent.status_requested:
            agent.status_requested = False
            try:
                text = self.status()
            except Exception as e:
                text = f"npurun: status unavailable: {e}"
            from launcher.agent import say  # noqa: PLC0415
            say(text)
            path = status_file(os.getpid())
            tmp = f"{path}.tmp"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(text + "\n")
            os.replace(tmp, path)
        now = time.time()
        if agent.job is None or agent.job.node_rank != 0 or now < self._next_poll:
            return None         # node 0 watches the whole job; the others would repeat it
        self._next_poll = now + POLL
        try:
            return self.watch(now)
        except (OSError, ConnectionError, TimeoutError, ValueError) as e:   # the store is busy
            import logging  # noqa: PLC0415
            logging.getLogger("launcher").debug("npurun: watching the job: %s", e)
            return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def status_file(pid: int) -> str:
    """Where npurun ``pid`` writes its live status table (user-private directory)."""
    from launcher.secret import secure_dir  # noqa: PLC0415
    return os.path.join(secure_dir(), f"npurun-{pid}.status")


def query_status(pid: int | None, timeout: float = 10.0) -> int:
    """``npurun --status [PID]``: ask a running npurun for its table and print it."""
    import glob  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from launcher.secret import secure_dir  # noqa: PLC0415
    if pid is None:
        pids = []
        for path in glob.glob(os.path.join(secure_dir(), "npurun-*.job")):
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
    if not os.path.exists(os.path.join(secure_dir(), f"npurun-{pid}.job")):
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
    from launcher.secret import secure_dir  # noqa: PLC0415
    path = os.path.join(secure_dir(), f"npurun-{pid}.job")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(str(pid))
    return path
