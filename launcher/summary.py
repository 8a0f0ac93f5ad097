"""The failure summary: torchrun's ChildFailedError block, root cause first and with a traceback.

The root cause is the first failure: the earliest error-file timestamp (written by the worker when
its exception escaped), else the time the launcher saw the process end. Every failure shows its
Python traceback when the worker left one, whether or not the entry point was decorated.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime

from launcher.errors import describe_exit, shell_exit_code, signal_name

NOT_AVAILABLE = "<N/A>"


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

    def __post_init__(self) -> None:
        self.timestamp = self.observed_at
        data = read_error_file(self.error_file)
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
    """The first failure: smallest timestamp, ties broken by rank. A rank that failed with
    ``RemoteRankError`` only echoes another rank's failure (which its peers may see before
    npurun does), so it is the root cause only if every failure is such an echo."""
    primary = [f for f in failures if "RemoteRankError" not in f.message] or failures
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

    blocks = [_format_one(i + 1, f, shown(f)) for i, f in enumerate(others)]
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
                  f"Stopped by npurun after the failure: ranks {', '.join(map(str, stopped))}"]
    if restarting:
        parts.append("npurun restarts the job (--max-restarts)")
    else:
        parts.append(f"npurun exits with {root.shell_exitcode} "
                     f"(rank {root.rank}: {describe_exit(root.exitcode)})")
    parts.append("=" * width)
    return "\n".join(parts)
