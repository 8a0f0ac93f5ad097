"""The janitor: a tiny process that cleans up after a launcher that died without cleaning up.

The workers die with the launcher by their parent-death signal (``launcher.worker``), but that
signal reaches neither the processes a worker forked nor the job's shared memory. So the launcher
first starts a janitor (``/bin/sh``, its own session, stdin = a pipe from the launcher) and tells
it, one line each, what would need cleaning:

    pg <pgid>      a worker's process group      unpg <pgid>   that group is gone
    shm <job_id>   /dev/shm/npusim-<job_id>-*    dir <path>    a temporary directory
    bye            the launcher cleaned up itself: exit doing nothing

End of file without ``bye`` means the launcher died (SIGKILL, crash): the janitor SIGKILLs every
group still registered and removes the segments and directories. It is a shell loop of builtins
rather than a Python process because a Python interpreter takes ~0.1 s to start here.
"""
from __future__ import annotations

import os
import re
import subprocess

_SCRIPT = r"""
trap '' INT HUP TERM PIPE QUIT
pgs=' '; jobs=''; dirs=''
nl='
'
while IFS=' ' read -r cmd arg; do
  case "$cmd" in
    bye) exit 0 ;;
    pg) case "$arg" in ''|*[!0-9]*) ;; *) pgs="$pgs$arg " ;; esac ;;
    unpg) new=' '; for p in $pgs; do [ "$p" = "$arg" ] || new="$new$p "; done; pgs=$new ;;
    shm) case "$arg" in ''|*[!A-Za-z0-9_.]*) ;; *) jobs="$jobs $arg" ;; esac ;;
    dir) case "$arg" in /*) dirs="$dirs$arg$nl" ;; esac ;;
  esac
done
for p in $pgs; do kill -9 -"$p" 2>/dev/null; done
for j in $jobs; do rm -f /dev/shm/npusim-"$j"-*; done
IFS=$nl
for d in $dirs; do rm -rf -- "$d"; done
"""

_SAFE_JOB = re.compile(r"^[A-Za-z0-9_.]+$")


class Janitor:
    """Handle on the janitor process; every method is a no-op once ``close`` was called."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            ["/bin/sh", "-c", _SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        self._closed = False

    def _say(self, line: str) -> None:
        if self._closed:
            return
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def watch_group(self, pgid: int) -> None:
        self._say(f"pg {int(pgid)}")

    def forget_group(self, pgid: int) -> None:
        self._say(f"unpg {int(pgid)}")

    def watch_job(self, job_id: str) -> None:
        if _SAFE_JOB.match(job_id):
            self._say(f"shm {job_id}")

    def watch_dir(self, path: str) -> None:
        if os.path.isabs(path) and "\n" not in path:
            self._say(f"dir {path}")

    def close(self) -> None:
        """Tell the janitor all is clean and reap it."""
        if self._closed:
            return
        self._say("bye")
        self._closed = True
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
