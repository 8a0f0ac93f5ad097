"""Rank-side hang diagnosis: publish this rank's collective state, and abort on a dead peer.

Under npurun (``NPUSIM_DIAG=1``) every process that creates a world communicator from the
launcher's environment starts one daemon *reporter* thread. It

- publishes this rank's state as JSON under ``state_key(rank)`` in the job's rendezvous store
  every ``NPUSIM_DIAG_INTERVAL`` seconds (default 0.5) and at once when a collective fails:
  heartbeat time, pid, the in-flight records
  (op, comm and members, seq, stream, state, the peer waited on and since when, call site), the
  per-communicator progress (last enqueued / last completed seq), the recent records, and the
  start / end times of the last TIMELINE collectives as numbers (``FlightRecorder.timeline``,
  read by npurun's fail-slow detector);
- holds a blocking ``get`` on the job's abort key in the rendezvous store: when the launcher
  sees a rank die (or finds a deadlock) it sets that key to a typed abort record
  (``hccl.abortrec``), and every live rank aborts all its communicators at once with that record,
  so peers waiting for the dead rank fail in seconds with ``RemoteRankError`` naming it instead
  of waiting for HCCL_EXEC_TIMEOUT.

The published state also carries ``host``, ``node`` (GROUP_RANK) and ``interval``: the launcher
tells a rank whose state stopped refreshing (``time`` older than a few intervals) from a live one.

The launcher reads the states (plus stacks taken with SIGUSR1) to build the job verdict; the
store reaches every node, so one report covers the whole job.
Nothing here runs without npurun, and nothing is on a collective's fast path.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from . import abortrec, config
from .flight import recorder

log = logging.getLogger("hccl.diag")
_RECENT = 64
TIMELINE = 128     # collectives per publish, for launcher.failslow (read every second)
FLUSH_TIMEOUT = 10.0  # s a failing collective may spend publishing its state (a cut link)

_lock = threading.Lock()
_reporter: "Reporter | None" = None


def _prefix(env=None) -> str:
    return (config.job() if env is None else config.Job.from_env(env)).key_prefix


def abort_key(env=None) -> str:
    """The store key whose value (an ``hccl.abortrec`` record) makes every rank abort its
    communicators."""
    return f"{_prefix(env)}/abort"


def state_key(rank: int, env=None) -> str:
    """The store key holding rank ``rank``'s published state (JSON)."""
    return f"{_prefix(env)}/state/{rank}"


class Reporter:
    """The per-process reporter thread (see the module note)."""

    def __init__(self, store, interval: float):
        self.store, self.interval = store, interval
        self.rank = config.job_rank()
        self.key = state_key(self.rank)
        self.worlds: list = []
        self.aborted: dict | None = None     # the abort record received from the launcher
        self.node = config.node_rank()
        self.host = socket.gethostname()
        self._stop = threading.Event()
        self._write_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="npusim-diag", daemon=True)

    def add_world(self, world) -> None:
        self.worlds.append(world)

    def snapshot(self) -> dict:
        # every interval: only the records published are converted, not the whole ring
        d = recorder.tail(_RECENT, 8)
        return {"rank": self.rank, "pid": os.getpid(), "time": time.time(),
                "interval": self.interval, "host": self.host, "node": self.node,
                "in_flight": d["in_flight"], "progress": d["progress"],
                "recent": d["recent"],
                "failed": d["failed"],
                "timeline": recorder.timeline(TIMELINE),
                "aborted": self.aborted,
                # faulthandler prints thread ids only: the launcher names them with this
                "threads": {f"0x{t.ident:016x}": t.name for t in threading.enumerate() if t.ident}}

    def write(self, timeout: float | None = None) -> None:
        """Publish the state now; give up after ``timeout`` s (None: FLUSH_TIMEOUT), waiting for
        a write in progress included.

        A failing collective calls this with a short timeout: its error must not wait on a store
        that may be unreachable (a cut link), and npurun reads the error files too.
        """
        deadline = time.monotonic() + (FLUSH_TIMEOUT if timeout is None else timeout)
        if not self._write_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        try:
            self.store.set(self.key, json.dumps(self.snapshot(), default=str).encode(),
                           timeout=max(0.1, deadline - time.monotonic()))
        except Exception as e:  # the launcher may be gone at shutdown
            log.debug("cannot publish state: %s", e)
        finally:
            self._write_lock.release()

    def _run(self) -> None:
        key = abort_key()
        while not self._stop.is_set():
            self.write()
            if self.aborted is not None:
                self._stop.wait(self.interval)
                continue
            try:
                value = self.store.get(key, timeout=self.interval)
            except TimeoutError:
                continue
            except Exception:  # store gone (launcher exiting): keep writing state
                self._stop.wait(self.interval)
                continue
            self._abort(value.decode("utf-8", "replace"))

    def _abort(self, text: str) -> None:
        """Abort every communicator of every world of this process with the launcher's record."""
        ab = abortrec.read(text)
        self.aborted = ab
        # a warning: the rank's own error (one line) and npurun's verdict tell the user
        log.warning("rank %d: aborting every communicator: %s", self.rank, ab["text"])
        reason = abortrec.record(ab["kind"], ab.get("rank"), ab["text"])
        # applied here only, not announced to the peers: every rank reads this key itself, and
        # N ranks each announcing it to N - 1 peers was N^2 messages (and, with connections
        # made at first use, N^2 connections: +6 s from stall to exit at world 128)
        for world in self.worlds:
            for cid in list(world.comm_ids):
                try:
                    world.transport.apply_abort(cid, world.rank, reason)
                except Exception:
                    pass
        self.write()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def attach(world, store) -> None:
    """Register ``world`` with this process's reporter, starting it under npurun."""
    global _reporter
    if not config.diag_enabled() or store is None:
        return
    with _lock:
        if _reporter is None:
            _reporter = Reporter(store, config.diag_interval())
            _reporter.start()
        _reporter.add_world(world)


def flush() -> None:
    """A collective just failed: publish the state now, and dump the flight recorder as JSON to
    ``NPUSIM_FLIGHT_FILE`` (npurun: ``<log dir>/<run>/attempt_<k>/<local rank>/flight_recorder.json``)."""
    r = _reporter
    if r is not None:
        r.write(timeout=FLUSH_TIMEOUT)
    path = config.flight_file()
    if path:
        try:
            recorder.dump_to(path)
        except OSError as e:
            log.debug("cannot dump the flight recorder to %s: %s", path, e)
