"""``npurun --status``: the user's running npurun jobs, and the live table of one of them.

Each npurun registers itself in the user's private directory (``npurun-<pid>.job``: its pid,
start time and command). ``npurun --status PID`` sends SIGUSR1 to that npurun, which writes its
table to ``npurun-<pid>.status`` (``answer``); the requester prints it. The table goes only to
the requester: the job's console is someone's training log. Without a pid, one running job is
the one; several are listed, and the requester is asked which (a pid is required when stdin is
not a terminal).
"""
from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

from launcher.secret import secure_dir


def status_file(pid: int) -> str:
    """Where npurun ``pid`` writes its live status table (user-private directory)."""
    return os.path.join(secure_dir(), f"npurun-{pid}.status")


def _job_file(pid: int) -> str:
    return os.path.join(secure_dir(), f"npurun-{pid}.job")


def register(pid: int, cmd: list[str] | None = None) -> str:
    """Mark npurun ``pid`` as running (for ``npurun --status``): its start time and command."""
    path = _job_file(pid)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump({"pid": pid, "started": time.time(), "cmd": list(cmd or [])}, f)
    return path


def answer(text: str) -> None:
    """Write this npurun's table for the requester (atomically: it polls the file)."""
    path = status_file(os.getpid())
    tmp = f"{path}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text.rstrip("\n") + "\n")
    os.replace(tmp, path)


def running_jobs() -> list[dict]:
    """The user's running npurun jobs, oldest first: ``{"pid", "started", "cmd"}``."""
    jobs = []
    for path in glob.glob(os.path.join(secure_dir(), "npurun-*.job")):
        name = os.path.basename(path)[len("npurun-"):-len(".job")]
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            os.kill(pid, 0)
            with open(path) as f:
                raw = f.read()
        except OSError:
            continue
        try:
            info = json.loads(raw)
        except ValueError:
            info = None
        if not isinstance(info, dict):      # registered by an older npurun: its pid only
            info = {}
        cmd = [str(c) for c in info.get("cmd") or ()] or _cmdline(pid)
        started = float(info.get("started") or 0.0) or os.stat(path).st_mtime
        jobs.append({"pid": pid, "started": started, "cmd": cmd})
    return sorted(jobs, key=lambda j: (j["started"], j["pid"]))


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _listing(jobs: list[dict]) -> str:
    now = time.time()
    lines = [f"npurun --status: {len(jobs)} running npurun jobs of yours; which one? "
             "(npurun --status PID)", f"{'pid':>8}  {'running for':>11}  command"]
    for j in jobs:
        age = f"{now - j['started']:.0f} s" if j["started"] else "?"
        lines.append(f"{j['pid']:>8}  {age:>11}  {' '.join(j['cmd']) or '?'}")
    return "\n".join(lines)


def _choose(jobs: list[dict]) -> int | None:
    """The pid the user picks among ``jobs`` (asked on a terminal), or None."""
    print(_listing(jobs), file=sys.stderr)
    if not sys.stdin.isatty():
        return None
    try:
        raw = input("pid: ").strip()
    except EOFError:
        return None
    if raw.isdigit() and int(raw) in {j["pid"] for j in jobs}:
        return int(raw)
    print(f"npurun --status: {raw!r} is not one of the pids listed", file=sys.stderr)
    return None


def query_status(pid: int | None, timeout: float = 10.0) -> int:
    """``npurun --status [PID]``: ask a running npurun for its table and print it.

    Exit code 0 with the table on stdout; 1 if there is no such job or it did not answer; 2 if
    several jobs run and none was chosen (they are listed on stderr).
    """
    if pid is None:
        jobs = running_jobs()
        if not jobs:
            print("npurun --status: no running npurun job of yours was found", file=sys.stderr)
            return 1
        pid = jobs[0]["pid"] if len(jobs) == 1 else _choose(jobs)
        if pid is None:
            return 2
    if not os.path.exists(_job_file(pid)):
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
