"""The failure summary: torchrun's ChildFailedError block, root cause first and with a traceback.

Without a job verdict (a plain exception, a crash outside any collective) the root cause is the
first failure: the earliest error-file timestamp (written by the worker when its exception
escaped), else the time the launcher saw the process end. Every failure shows its Python
traceback when the worker left one, whether or not the entry point was decorated.

After a job verdict (``format_story``) the summary agrees with it: the root cause is the
verdict's culprit, the other failures are one line each, released by it.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime

from hccl.failure import Failure
from launcher.errors import describe_exit, shell_exit_code, signal_name
from launcher.diagnosis.report import ranks_text, short_ranks

NOT_AVAILABLE = "<N/A>"
GROUP_AT = 8        # more released ranks than this: grouped by how they ended, ranks as ranges
CULPRITS_SHOWN = 3  # a story shows this many culprits in full, the rest as ranges
WAYS_SHOWN = 4      # and at most this many lines of released ranks (one per way they ended)


@dataclass
class ProcessFailure:
    """One failed worker; ``exitcode`` is Popen style (negative = killed by that signal)."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    observed_at: float
    hostname: str = field(default_factory=socket.gethostname)
    message: str = field(init=False, default="")
    traceback: str = field(init=False, default="")
    timestamp: float = field(init=False, default=0.0)
    kind: str = field(init=False, default="")     # the error file's typed kind, if any
    error_line: str = field(init=False, default="")   # its "Type: first line", if any

    def __post_init__(self) -> None:
        self.timestamp = self.observed_at
        data = read_error_file(self.error_file)
        if data and isinstance(data.get("error"), dict):
            self.kind = str(data["error"].get("kind") or "")
            self.error_line = f"{data['error'].get('type')}: {data['error'].get('text')}"
        if data:
            msg = data.get("message")
            if isinstance(msg, dict):
                self.message = str(msg.get("message", ""))
                self.traceback = str(msg.get("extraInfo", {}).get("py_callstack", ""))
                ts = data.get("timestamp", msg.get("extraInfo", {}).get("timestamp"))
            else:
                self.message, ts = str(msg or ""), data.get("timestamp")
            try:
                self.timestamp = min(float(ts), self.observed_at)
            except (TypeError, ValueError):
                pass
        if not self.message:
            if self.exitcode < 0:
                self.message = (f"Signal {-self.exitcode} ({signal_name(-self.exitcode)}) "
                                f"received by PID {self.pid}")
            else:
                self.message = (f"Process {self.pid} exited with code {self.exitcode} without "
                                f"a Python exception (os._exit, sys.exit or a native crash)")

    @property
    def signal(self) -> str | None:
        return signal_name(-self.exitcode) if self.exitcode < 0 else None

    @property
    def shell_exitcode(self) -> int:
        return shell_exit_code(self.exitcode)

    def time_text(self) -> str:
        return datetime.fromtimestamp(self.timestamp).isoformat(sep="_", timespec="milliseconds")


def read_error_file(path: str) -> dict | None:
    """The JSON of a worker's error file, or None if it has none (or it is unreadable)."""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def root_cause(failures: list[ProcessFailure]) -> ProcessFailure:
    """The first failure: smallest timestamp, ties broken by rank. A rank whose error file says
    it was ``released`` (a RemoteRankError) only echoes another rank's failure (which its peers
    may see before npurun does), so it is the root cause only if every failure is such an echo."""
    primary = [f for f in failures if f.kind != Failure.RELEASED] or failures
    return min(primary, key=lambda f: (f.timestamp, f.rank))


def _indent(text: str, pad: str = "    ") -> str:
    return ("\n" + pad).join(text.rstrip().splitlines())


def _format_one(idx: int, f: ProcessFailure, error_file_shown: str) -> str:
    code = f"{f.exitcode} ({f.signal}, exit {f.shell_exitcode})" if f.signal else f"{f.exitcode}"
    lines = [
        f"[{idx}]:",
        f"  time      : {f.time_text()}",
        f"  host      : {f.hostname}",
        f"  rank      : {f.rank} (local_rank: {f.local_rank})",
        f"  exitcode  : {code} (pid: {f.pid})",
        f"  error_file: {error_file_shown}",
    ]
    if f.traceback:
        lines.append(f"  traceback : {_indent(f.traceback)}")
    else:
        lines.append(f"  message   : {f.message}")
    return "\n".join(lines)


def format_summary(title: str, failures: list[ProcessFailure], stopped: list[int] = (),
                   keep_files: bool = True, restarting: bool = False) -> str:
    """The block npurun prints: other failures, then the root cause, then who was stopped.

    ``stopped`` lists the ranks the launcher terminated because of the failure; ``keep_files``
    False says the error files lived in a temporary directory that is gone by now;
    ``restarting`` says the job restarts (--max-restarts) instead of exiting.
    """
    root = root_cause(failures)
    others = sorted((f for f in failures if f is not root), key=lambda f: (f.timestamp, f.rank))

    def shown(f: ProcessFailure) -> str:
        if not f.error_file or not os.path.isfile(f.error_file):
            return f"{NOT_AVAILABLE} (no Python exception recorded)"
        return f.error_file if keep_files else f"{NOT_AVAILABLE} (pass --log-dir to keep it)"

    blocks = [_format_one(i + 1, f, shown(f)) for i, f in enumerate(others[:GROUP_AT])]
    if len(others) > GROUP_AT:     # a big job: the first ones in full, the rest as ranges
        rest = others[GROUP_AT:]
        groups: dict = {}
        for f in rest:
            groups.setdefault(describe_exit(f.exitcode), []).append(f.rank)
        blocks += [f"  ... {len(rest)} more: " + "; ".join(
            f"{_ranks(rs)}: {how}" for how, rs in sorted(groups.items(),
                                                              key=lambda kv: -len(kv[1])))
            + " (their error files are next to the ones above)"]
    root_block = _format_one(0, root, shown(root))
    width = 72
    parts = [
        "=" * width,
        f"{title} FAILED",
        "-" * width,
        "Failures:",
        "\n".join(blocks) if blocks else "  <NO_OTHER_FAILURES>",
        "-" * width,
        "Root Cause (first observed failure):",
        root_block,
    ]
    if stopped:
        parts += ["-" * width,
                  "Stopped by npurun after the failure: " + (
                      f"ranks {', '.join(map(str, stopped))}" if len(stopped) <= GROUP_AT
                      else _ranks(stopped))]
    if restarting:
        parts.append("npurun restarts the job (--max-restarts)")
    else:
        parts.append(f"npurun exits with {root.shell_exitcode} "
                     f"(rank {root.rank}: {describe_exit(root.exitcode)})")
    parts.append("=" * width)
    return "\n".join(parts)


@dataclass
class Culprit:
    """A rank the job verdict blames, as the summary shows it."""

    rank: int
    state: str                        # the verdict's state (dead, not_entered, mismatch, ...)
    detail: str                       # the verdict's one line about it
    local_rank: int | None = None     # None: on another node
    pid: int | None = None
    exitcode: int | None = None       # None: alive when the verdict was taken (or remote)
    stopped: bool = False             # stopped by npurun after the verdict
    failure: ProcessFailure | None = None


def story_exit_code(culprits: list[Culprit]) -> int:
    """What npurun exits with after a verdict: the first culprit's own failure code, else 1."""
    for c in culprits:
        if c.failure is not None:
            return c.failure.shell_exitcode
    return 1


def format_story(title: str, reason: str, culprits: list[Culprit],
                 failures: list[ProcessFailure], *, tracebacks: str,
                 restarting: bool = False) -> str:
    """The failure summary after a job verdict: it agrees with the verdict.

    The root cause is the verdict's culprit (never the first rank to time out); every other
    failure is one line, listed as released by it; ``tracebacks`` says where the ranks' full
    tracebacks are (a path with ``<local_rank>`` in it): the line names the local ranks that
    wrote one, and is left out when none did (a rank that died by a signal writes none).
    """
    width = 72
    blamed = {c.rank for c in culprits}
    parts = ["=" * width, f"{title} FAILED ({reason})", "-" * width,
             "Root Cause (the job verdict's culprit" + ("s" if len(culprits) > 1 else "") + "):"]
    for i, c in enumerate(culprits[:CULPRITS_SHOWN]):
        where = (f"{c.rank} (local_rank: {c.local_rank})" if c.local_rank is not None
                 else f"{c.rank} (on another node)")
        if c.failure is not None:
            f = c.failure
            code = (f"{f.exitcode} ({f.signal}, exit {f.shell_exitcode})" if f.signal
                    else f"{f.exitcode}")
            status = f"{code} (pid: {f.pid})"
        elif c.stopped:
            status = f"stopped by npurun after the verdict (pid: {c.pid})"
        elif c.exitcode is not None:
            status = f"{c.exitcode} (pid: {c.pid})"
        else:
            status = "not stopped from this node" if c.local_rank is None else \
                f"alive (pid: {c.pid})"
        parts += [f"[{i}]:", f"  rank      : {where}", f"  exitcode  : {status}",
                  f"  state     : {c.state}: {c.detail}"]
        if c.failure is not None and c.failure.message and c.failure.kind != Failure.RELEASED:
            parts.append(f"  error     : {_one_line(c.failure.error_line or c.failure.message)}")
    if len(culprits) > CULPRITS_SHOWN:      # each in the verdict above and hang_report.json
        rest = culprits[CULPRITS_SHOWN:]
        states = sorted({c.state for c in rest})
        parts.append(f"  ... {len(rest)} more culprits: {_ranks([c.rank for c in rest])} "
                     f"({', '.join(states)}; see the verdict above)")
    victims = sorted((f for f in failures if f.rank not in blamed), key=lambda f: f.rank)
    if victims:
        who = "the culprit" if len(culprits) == 1 else "the culprits"
        if len(victims) <= GROUP_AT:
            parts += ["-" * width, f"Released by {who} (not causes; one line each):"]
            for f in victims:
                parts.append(f"  rank {f.rank}: {describe_exit(f.exitcode)}: "
                             f"{_one_line(f.error_line or f.message)}")
        else:       # a big job: one line per way of ending, with the first rank's error
            parts += ["-" * width, f"Released by {who} (not causes; one line per way they "
                      "ended, the first rank's error as the example):"]
            groups: dict = {}
            for f in victims:
                line = f.error_line or f.message or ""
                groups.setdefault((describe_exit(f.exitcode), line.split(":", 1)[0]), []).append(f)
            ways = sorted(groups.items(), key=lambda kv: -len(kv[1]))
            if len(ways) > WAYS_SHOWN:
                rest = [f.rank for _, fs in ways[WAYS_SHOWN - 1:] for f in fs]
                ways = ways[:WAYS_SHOWN - 1]
            else:
                rest = []
            for (how, _), fs in ways:
                parts.append(f"  {_ranks([f.rank for f in fs])}: {how}: "
                             f"{'e.g. ' if len(fs) > 1 else ''}"
                             f"{_one_line(fs[0].error_line or fs[0].message, 160)}")
            if rest:
                parts.append(f"  {_ranks(rest)}: "
                             f"{len(groups) - len(ways)} other ways of ending (their error files)")
    written = _written(tracebacks, failures)
    if written:
        listed = (", ".join(map(str, written)) if len(written) <= GROUP_AT
                  else short_ranks(written, 100))
        parts.append(f"Full tracebacks: {tracebacks} (local rank{'s' if len(written) > 1 else ''} "
                     f"{listed})")
    names = ", ".join(str(c.rank) for c in culprits) or "none found"
    if restarting:
        parts.append(f"npurun restarts the job (--max-restarts); culprit rank(s): {names}")
    else:
        c0 = culprits[0] if culprits else None
        why = (f"culprit rank {c0.rank}: {c0.state}" if c0 else "no culprit found")
        if c0 is not None and c0.failure is not None:
            why += f", {describe_exit(c0.failure.exitcode)}"
        parts.append(f"npurun exits with {story_exit_code(culprits)} ({why})")
    parts.append("=" * width)
    return "\n".join(parts)


def _ranks(ranks: list[int]) -> str:
    """``ranks 0-36, 38-127`` for a line of the summary; a long list is cut with its count."""
    return ranks_text(ranks) if len(ranks) == 1 else "ranks " + short_ranks(ranks, 100)


def _written(pattern: str, failures: list[ProcessFailure]) -> list[int]:
    """The local ranks of ``failures`` whose file ``pattern`` (``<local_rank>`` filled in)
    exists: a report points only to files that are there."""
    if "<local_rank>" not in pattern:
        return [f.local_rank for f in failures] if os.path.isfile(pattern) else []
    return sorted({f.local_rank for f in failures
                   if os.path.isfile(pattern.replace("<local_rank>", str(f.local_rank)))})


def _one_line(text: str, limit: int = 220) -> str:
    """The first line of ``text``, shortened at a word (never inside one) to ``limit``."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    if len(line) <= limit:
        return line
    cut = line[:limit - 3]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "..."
