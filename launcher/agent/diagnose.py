"""npurun's side of hang diagnosis: gather every rank's state, print ONE verdict, keep it as JSON.

Plugs into the agent (``supervisor``'s hooks, ``api``): a ``before_stop`` hook runs on the
first failure while the other ranks are still alive. It

1. takes the local ranks' Python stacks (SIGUSR1; SIGUSR2 for one stuck in C: no cooperation
   needed) and reads every rank's state from the store (one store serves every node);
2. tells every live rank, through the job's store, that the job stops and why (a typed abort
   record naming the culprit: ``hccl.diag`` aborts their communicators, so ranks waiting for a
   dead peer fail in seconds, naming it);
3. gives the ranks a moment to publish their final state, classifies every rank
   (``diagnosis.verdict``), writes ``hang_report.json`` to the log dir (``--log-dir``, else the
   current directory) and keeps the verdict for the agent, which prints it first and builds the
   failure summary from it.

While the job runs, ``on_tick`` polls the states about once a second (the fail-slow detector
on every node's npurun, the rest on node 0's only):

- a wait-for cycle that stays the same for NPUSIM_DEADLOCK_STABLE seconds (default 3) is a
  deadlock: the job is stopped at once with a ``deadlock`` verdict, whatever HCCL_EXEC_TIMEOUT is;
- ranks that wait NPUSIM_HANG_NOTICE seconds (default 15) for a rank that does not come (alive
  in its own code, in another collective, or with its send queued behind a blocked receive)
  make npurun name that rank with its state and Python stack, worded as a notice
  ("rank 2 has not called seq 5 of world for 15 s; ranks 0, 1, 3 wait for it"), once per stall
  and then every NPUSIM_HANG_REMIND seconds (default 300); the job keeps running until
  HCCL_EXEC_TIMEOUT.
- the ranks' collective timelines feed the fail-slow detector (``diagnosis.failslow``): a slow
  rank is named in a notice once per episode, and ``finish`` prints the job's findings and
  writes them to ``failslow_report.json`` (and into ``hang_report.json`` when there is one).

It only reports when the job has communicators (a rank published its state): a job without
any gets the usual failure summary alone. ``status()`` gives the same table for a running job
(``npurun --status``, see ``launcher.diagnosis.status``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

from hccl.failure import COLLECTIVE, Failure, parse
from launcher import config
from launcher.diagnosis import failslow, report, verdict
from launcher.errors import describe_exit
from launcher.procs.stacks import collect as collect_stacks
from launcher.diagnosis.status import answer as answer_status
from launcher.diagnosis.summary import read_error_file

SETTLE = 5.0          # at most this long for live ranks to publish a state newer than the failure
EXIT_GRACE = 1.5      # then at most this long (within SETTLE) for released ranks to exit
POLL = 1.0            # seconds between two reads of the states while the job runs
READERS = 8           # store round trips in flight at once when reading the states (states())


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
        rec = {"kind": Failure.ERROR.value, "type": "Error", "text": str(text or "").splitlines()[0]
               if text else ""}
    return rec, tb


def _across(cycle: list[dict]) -> str:
    return " across communicators" if len({e.get("comm") for e in cycle}) > 1 else ""


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
        self._pool = None               # the readers of states() at big worlds
        self._next_poll = 0.0
        self._cycle_key = None
        self._cycle_since = 0.0
        self._cycle: list | None = None
        self._noticed: dict = {}        # (comm_id, seq, op) of a stall -> when it was named
        self._pending = None            # (stall, when its notice is due, infos) not yet due
        self._poll_took = 0.0           # seconds the last full poll took
        self.notice_after = config.hang_notice()
        self.remind_after = config.hang_remind()
        self.stable_for = config.deadlock_stable()
        self.slow = failslow.Tracker()
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
        """Every rank's published state: one store round trip per rank (a missing key is
        answered at once: timeout 0), READERS of them in flight at a time. Each round trip
        waits for the store's thread to be scheduled: on a loaded 2-core machine at world 128,
        one after the other took 5-8 s, so the once-a-second poll ran every 6-9 s and a stall
        was named 21 s after it began instead of 15."""
        n = self.agent.job.world_size
        if n <= READERS:
            return self.read_states(range(n))
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415
            self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="npurun-states")
        out = {}
        for part in self._pool.map(self.read_states,
                                   [range(i, n, READERS) for i in range(READERS)]):
            out.update(part)
        return dict(sorted(out.items()))

    def read_states(self, ranks) -> dict[int, dict]:
        """The published states of ``ranks``, one store round trip each (a missing or
        unreadable state is left out)."""
        from hccl.diag import state_key  # noqa: PLC0415
        c, env, got = self.client(), self._env(), {}
        for r in ranks:
            try:
                got[r] = json.loads(c.get(state_key(r, env), timeout=0))
            except Exception:   # a missing or unreadable state is reported as such
                continue
        return got

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
                if rec is not None and parse(rec.get("kind")) in COLLECTIVE:
                    return True
        return False

    def before_stop(self, agent, reason: str) -> None:
        if agent.stop_signal:          # the user asked to stop: no verdict needed
            return
        states = self.states()
        if not states and not self._collective_failed():
            return                 # no communicator in the job: the failure summary says it all
        t0 = time.time()
        agent.poll_live()                    # a rank that has exited since is not asked
        stacks = agent.collect_stacks(2.0)   # before the abort below releases the waiting ranks
        cycle = self._cycle if self._cycle_stable() else None
        first = verdict.classify(self.infos(states, stacks), cycle=cycle)
        self._abort_all(first)
        self._settle(t0)
        v = verdict.classify(self.infos(self.states(), stacks), cycle=cycle)
        slow = self.slow.summary()
        if slow:
            v["failslow"] = [f.to_dict() for f in slow]
        os.makedirs(self.report_dir, exist_ok=True)
        path = os.path.join(self.report_dir, "hang_report.json")
        with open(path, "w") as f:
            json.dump(v, f, indent=1, default=str)
        self.report = {"verdict": v, "text": report.format_report(v), "path": path}

    def _abort_all(self, v: dict) -> None:
        """Release every live rank with a typed record naming the culprit (``hccl.diag``)."""
        from hccl import abortrec  # noqa: PLC0415
        from hccl.diag import abort_key  # noqa: PLC0415
        culprits = v.get("culprits") or []
        by_state = {}
        for c in culprits:
            by_state.setdefault(v["ranks"].get(str(c), {}).get("state"), []).append(c)
        # short: every released rank prints it in its one-line error; npurun's report has the rest
        if v.get("reason") == Failure.DEADLOCK:
            rec = abortrec.record(Failure.DEADLOCK, culprits[0] if culprits else None,
                                  f"npurun stops the job: deadlock of ranks {culprits}"
                                  f"{_across(v.get('cycle') or [])} (see npurun's report)")
        elif by_state.get("dead"):
            c = by_state["dead"][0]
            rec = abortrec.record(Failure.DEAD, c, f"rank {c} {describe(v['ranks'][str(c)])}")
        elif by_state.get("error"):
            c = by_state["error"][0]
            rec = abortrec.record(Failure.ERROR, c, f"rank {c} failed in its own code: "
                                  f"{v['ranks'][str(c)].get('error')}")
        else:
            rec = abortrec.record(Failure.STOPPED, culprits[0] if culprits else None,
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
        self._settle_lost_nodes(t0)

    def _settle_lost_nodes(self, t0: float) -> None:
        """A node lost with its ranks (SIGKILLed, powered off): its ranks' states were fresh when
        the failure came, and would read as ranks alive in user code. When every rank of another
        node published nothing since ``t0`` (1.5 s given: they publish every 0.5 s), watch that
        node's npurun: a heartbeat or its goodbye (``bye/<node>``) clears it at once; silent for
        NPUSIM_NODE_TIMEOUT (the rendezvous' own rule for a lost node), it is lost, and the wait
        goes on until its ranks' states are stale, so that the verdict names them unreachable on
        that node (issue 53). A node alive but slow to beat only delays the verdict."""
        from launcher.rendezvous import K  # noqa: PLC0415
        rdzv, job = self.agent.rdzv, self.agent.job
        client = getattr(rdzv, "client", None)
        if client is None or job is None or job.nnodes < 2:
            return
        n, me = job.nproc_per_node, job.node_rank
        end = time.time() + 1.5
        while True:
            states = self.states()
            quiet = {r: st for r, st in states.items() if r // n != me
                     and float(st.get("time") or 0) <= t0}
            nodes = {i for i in {r // n for r in quiet}
                     if all(r in quiet for r in range(i * n, (i + 1) * n) if r in states)}
            if not nodes:
                return
            if time.time() >= end:
                break
            time.sleep(0.2)
        try:
            first = {i: client.add(f"{K}hb/{i}", 0) for i in nodes}
            silent_until = time.time() + config.node_timeout()
            while nodes and time.time() < silent_until:
                time.sleep(0.25)
                nodes = {i for i in nodes if client.add(f"{K}hb/{i}", 0) == first[i]
                         and not client.check([f"{K}bye/{i}"])}
        except Exception:       # the store is gone too: node 0's own loss is reported as such
            return
        wait = [st for r, st in quiet.items() if r // n in nodes]
        if not wait:
            return
        limit = max(verdict.STALE_MIN, *(10 * float(st.get("interval") or 0.5) for st in wait))
        end = time.time() + limit + 1.0
        while time.time() < end and any(time.time() - float(st.get("time") or 0) <= limit + 0.2
                                        for st in wait):
            time.sleep(0.1)

    # -- while the job runs -----------------------------------------------------------------
    def _cycle_stable(self) -> bool:
        return (self._cycle is not None
                and time.time() - self._cycle_since >= self.stable_for)

    def watch(self, now: float | None = None):
        """One poll of the running job: track a wait-for cycle, print the early notice.

        Returns a ``StopRequest`` once a cycle has been stable for NPUSIM_DEADLOCK_STABLE s.
        """
        states = self.states()
        # the time the states were read at (a poll of 128 states takes seconds when loaded):
        # a notice due by then is due now
        now = time.time() if now is None else now
        self._watch_slow(states)
        infos = self.infos(states, {})
        cycle = verdict.find_cycle(infos)
        key = verdict.cycle_key(cycle)
        if key != self._cycle_key:
            self._cycle_key, self._cycle, self._cycle_since = key, cycle, now
        elif cycle is not None:
            self._cycle = cycle
            if now - self._cycle_since >= self.stable_for:
                from launcher.agent.api import StopRequest  # noqa: PLC0415
                ranks = sorted({e["rank"] for e in cycle})
                return StopRequest(f"deadlock: ranks {ranks} wait for each other{_across(cycle)} "
                                   f"(stable for {now - self._cycle_since:.0f} s)")
        if self.notice_after > 0:
            self._notice(infos, now)
        return None

    def _watch_slow(self, states: dict) -> None:
        """Feed the fail-slow detector; a notice for each new episode (the job keeps running)."""
        self.slow.add(states)
        from launcher.agent.api import say  # noqa: PLC0415
        for f in self.slow.check():
            say(f"npurun: notice: {f.line()}; the job keeps running")

    def finish(self) -> None:
        """The end of the job, whatever its end: print the fail-slow findings (nothing when no
        rank was slow) and write them to ``failslow_report.json`` in the report directory."""
        slow = self.slow.summary()
        if not slow:
            return
        from launcher.agent.api import say  # noqa: PLC0415
        path = os.path.join(self.report_dir, "failslow_report.json")
        try:
            os.makedirs(self.report_dir, exist_ok=True)
            with open(path, "w") as f:
                json.dump({"findings": [x.to_dict() for x in slow]}, f, indent=1)
        except OSError as e:
            path = f"not written ({e})"
        say("npurun: fail-slow summary:\n" + "\n".join(f"  {x.line()}" for x in slow)
            + f"\nnpurun: fail-slow report: {path}")

    def _notice(self, infos: list[verdict.RankInfo], now: float) -> None:
        """Name the rank a stall waits for, with its state and stack: once when the ranks have
        waited NPUSIM_HANG_NOTICE s, then a reminder every NPUSIM_HANG_REMIND s."""
        self._pending = None
        stall = self._stall(infos)
        if stall is None:
            return
        key = (stall["comm_id"], stall["seq"], stall["op"])
        if now - stall["since"] < self.notice_after:
            if key not in self._noticed:
                self._pending = (stall, stall["since"] + self.notice_after, infos)
            return
        last = self._noticed.get(key)
        if last is not None and now - last < self.remind_after:
            return
        self._noticed[key] = now
        v = verdict.classify(infos, now=now)
        culprits = stall["blockers"] or v["culprits"]
        local = {w.rank: w for w in self.agent.live_workers() if w.rank in culprits}
        threads = {i.rank: (i.state or {}).get("threads") for i in infos}
        stacks_now = {r: report.name_threads(st, threads.get(r)) for r, st in collect_stacks(
            ((w.proc, w.proc.files.stack_file) for w in local.values()), 2.0).items()}
        from launcher.agent.api import say  # noqa: PLC0415
        say(report.format_notice(stall, v, culprits, stacks_now, now=now, reminder=last is not None,
                                 settings=f"NPUSIM_HANG_NOTICE={self.notice_after:g}, "
                                          f"HCCL_EXEC_TIMEOUT={config.exec_timeout_text()}"))

    @staticmethod
    def _stall(infos: list[verdict.RankInfo]) -> dict | None:
        """The oldest wait of the job: its collective (or receive), who waits in it and for whom.

        From the wait-for graph when some rank has not started what the others wait in; else
        (every member inside, one not progressing) from the longest wait alone.
        """
        edges = verdict.wait_edges(infos)
        if edges:
            # where the waits end: a collective whose missing ranks are not inside another one
            # themselves (in a job of subgroups the world's barrier may wait longest, for
            # ranks that wait in their groups for the one rank in its own code)
            held = verdict.held_in(infos, ("enqueued", "started"))
            late = {(e["comm_id"], e["seq"], e["op"]) for e in edges
                    if not e["op"].startswith("RECV") and held.get(e["waits_for"], set()) - {e["comm_id"]}}
            edges = [e for e in edges if (e["comm_id"], e["seq"], e["op"]) not in late] or edges
            first = min(edges, key=lambda e: e["since"] or float("inf"))
            same = [e for e in edges if (e["comm_id"], e["seq"], e["op"]) ==
                    (first["comm_id"], first["seq"], first["op"])]
            return {"comm": first["comm"], "comm_id": first["comm_id"], "seq": first["seq"],
                    "op": first["op"], "since": first["since"] or 0.0,
                    "waiters": sorted({e["rank"] for e in same}),
                    "blockers": sorted({e["waits_for"] for e in same})}
        longest = None
        for info in infos:
            for r in (info.state or {}).get("in_flight") or ():
                since = r.get("waiting_since") or r.get("t_started")
                if r.get("state") == "started" and since and r.get("peer") is None:
                    if longest is None or since < longest[1]:
                        longest = (info.rank, since, r)
        if longest is None:
            return None
        rank, since, r = longest
        return {"comm": r.get("comm"), "comm_id": r.get("comm_id"), "seq": r.get("seq"),
                "op": verdict.describe_call(r), "since": since, "waiters": [rank], "blockers": []}

    def _due(self, now: float) -> None:
        """A stall's notice falls due between two full polls: read the states of its waiters
        and blockers only (a full poll of 128 states took 5-15 s on a loaded machine, and the
        notice came that much late) and name it if it still stands. The other ranks' states
        are the last poll's."""
        stall, _, infos = self._pending
        self._pending = None
        try:
            fresh = self.read_states(sorted(set(stall["waiters"]) | set(stall["blockers"])))
        except (OSError, ConnectionError, TimeoutError, ValueError):
            return None                  # the next full poll tells
        infos = [dataclasses.replace(i, state=fresh[i.rank]) if i.rank in fresh else i
                 for i in infos]
        again = self._stall(infos)
        if again is not None and (again["comm_id"], again["seq"], again["op"]) == \
                (stall["comm_id"], stall["seq"], stall["op"]):
            self._notice(infos, now)
        return None

    def _live(self, v: dict) -> str:
        return report.format_report(v, stacks=False).replace(
            "npusim job verdict", f"npusim job status (attempt {self.agent.attempt}, live view)", 1)

    def status(self) -> str:
        """The verdict table of a running job (no stacks, nothing stopped), then the pid of
        each of this node's live ranks (what ``ps``, ``py-spy dump --pid`` and ``kill`` take)."""
        import socket  # noqa: PLC0415
        import textwrap  # noqa: PLC0415
        table = self._live(verdict.classify(self.infos(self.states(), {})))
        pids = [f"{w.rank}={w.proc.pid}" for w in self.agent.workers
                if w.proc.pid > 0 and w.proc.alive()]
        if not pids:
            return table
        node = getattr(self.agent.job, "node_rank", 0)
        return table.rstrip("\n") + "\n" + textwrap.fill(
            " ".join(pids), 94, initial_indent=f"pids (rank=pid) on node {node} "
            f"({socket.gethostname()}): ", subsequent_indent="    ") + "\n"

    def on_tick(self, agent):
        """Answer a status request (SIGUSR1 to npurun); about once a second, ``watch``."""
        if agent.status_requested:
            agent.status_requested = False
            try:
                text = self.status()
            except Exception as e:
                text = f"npurun: status unavailable: {e}"
            answer_status(text)         # to the requester only, never into the job's console
        now = time.time()
        if agent.job is None:
            return None
        if self._pending is not None and agent.job.node_rank == 0:
            due = self._pending[1]
            if now >= due:
                return self._due(now)
            if due - now < self._poll_took:     # a full poll now would end past it: wait
                return None
        if now < self._next_poll:
            return None
        self._next_poll = now + POLL
        try:
            if agent.job.node_rank != 0:    # node 0 judges hangs (the others would repeat it);
                self._watch_slow(self.states())   # fail-slow is told on every node's console
                return None
            request = self.watch()
            self._poll_took = time.time() - now
            return request
        except (OSError, ConnectionError, TimeoutError, ValueError) as e:   # the store is busy
            import logging  # noqa: PLC0415
            logging.getLogger("launcher").debug("npurun: watching the job: %s", e)
            return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None
