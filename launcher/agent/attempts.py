"""The attempts of a restarted job (``--max-restarts``): what each one did, for the end summary.

An attempt fails with a culprit (the job verdict's, else the first failure) and a class (the
verdict's reason: dead, error, timeout, mismatch, deadlock; without a verdict: ``dead`` for a
rank killed by a signal, ``error`` for a non-zero exit). The next attempt's ranks start from
what they saved: a training script that prints ``resumed from step N`` (the examples do) tells
npurun where, and the time from the failure to that line is the work's real cost of the failure
(restart plus reload), shown next to it.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

RESUMED_MARKER = b"resumed from step "
_RESUMED = re.compile(r"resumed from step (\d+)")
_LOG_SCAN = 1 << 16        # the line comes early: read the head of a redirected log only


@dataclass
class AttemptRecord:
    """One attempt; ``failed_at`` and ``resumed_at`` are wall-clock (time.time) seconds."""

    number: int
    outcome: str = "running"              # running / succeeded / failed / stopped
    culprits: list = field(default_factory=list)
    failure_class: str = ""
    detail: str = ""
    failed_at: float | None = None
    resumed_step: int | None = None       # what this attempt's ranks said they resumed from
    resumed_at: float | None = None

    def saw_line(self, line: str, now: float | None = None) -> None:
        """A console line with the marker: keep the first ``resumed from step N``."""
        m = _RESUMED.search(line)
        if m and self.resumed_step is None:
            self.resumed_step = int(m.group(1))
            self.resumed_at = time.time() if now is None else now

    def scan_logs(self, attempt_dir: str) -> None:
        """For ranks whose output went to files only (--redirects): look there for the line."""
        if self.resumed_step is not None or not os.path.isdir(attempt_dir):
            return
        for local in sorted(os.listdir(attempt_dir)):
            for name in ("stdout.log", "stderr.log"):
                try:
                    with open(os.path.join(attempt_dir, local, name), "rb") as f:
                        head = f.read(_LOG_SCAN).decode("utf-8", "replace")
                except OSError:
                    continue
                m = _RESUMED.search(head)
                if m:
                    self.resumed_step = int(m.group(1))
                    return


def failure_class(reason: str | None, exitcode: int) -> str:
    """The class of a failure: the verdict's reason, else dead (signal) or error (exit code)."""
    if reason:
        return reason
    return "dead" if exitcode < 0 else "error"


def format_attempts(records: list[AttemptRecord], max_restarts: int) -> str:
    """The end-of-job table: one line per attempt, the failure and where the next resumed."""
    lines = [f"npurun: attempts of this job ({len(records)}, --max-restarts {max_restarts}):"]
    for i, r in enumerate(records):
        text = f"  attempt {r.number}: {r.outcome}"
        if r.outcome == "failed":
            who = ", ".join(map(str, r.culprits)) if r.culprits else "none found"
            text += f": culprit rank(s) {who} ({r.failure_class})"
            if r.detail:
                text += f": {r.detail}"
        nxt = records[i + 1] if i + 1 < len(records) else None
        if nxt is not None:
            if nxt.resumed_step is None:
                text += "; the next attempt did not print 'resumed from step N'"
            else:
                text += f"; the next attempt resumed from step {nxt.resumed_step}"
                if nxt.resumed_at is not None and r.failed_at is not None:
                    text += f", {nxt.resumed_at - r.failed_at:.1f} s after the failure"
        lines.append(text)
    return "\n".join(lines)
