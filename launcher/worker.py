"""Worker bootstrap: what runs first in every rank started by npurun or launcher.spawn.

    python -u -m launcher.worker SCRIPT ARGS...        run a script as __main__
    python -u -m launcher.worker -m MODULE ARGS...     run a module as __main__ (python -m)
    python -u -m launcher.worker --exec PROGRAM ARGS...   --no-python: guard, then exec PROGRAM
    python -u -m launcher.worker --spawn PAYLOAD RESULT   launcher.spawn: fn(rank, *args)

Before the user's code runs, the bootstrap installs, in this order:

1. the parent-death guard: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, then a check that the launcher
   (``NPUSIM_LAUNCHER_PID``) did not die before the prctl took effect. The launcher forks workers
   from its main thread, which lives as long as the launcher does (the signal follows the forking
   *thread*). The launcher's janitor process (``launcher.janitor``) then kills the worker's whole
   process group and removes the job's shared memory.
2. an ``sys.excepthook`` that writes a torchrun-style error file to ``TORCHELASTIC_ERROR_FILE``
   (no ``@record`` decorator needed, with a typed ``error`` record) and prints the traceback
   without the bootstrap's frames; a collective (hccl) error prints as one line on the console,
   its full traceback going to ``traceback.log`` next to the error file.
3. ``faulthandler``: fatal-signal tracebacks to stderr, and on SIGUSR1 every thread's Python stack
   appended to ``NPUSIM_STACK_FILE``, so the launcher can take stacks without the rank's help.
   The file appears under its final name only once the handler is registered, so the launcher
   never sends SIGUSR1 (whose default action kills) before that.

Only the standard library is imported here, so start-up stays fast; ``cloudpickle`` is imported
in spawn mode only.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback

_PR_SET_PDEATHSIG = 1
_stack_file = None  # kept open for faulthandler for the life of the process
_SKIP_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the janitor still cleans up
        pass
    expected = os.environ.get("NPUSIM_LAUNCHER_PID", "")
    if expected.isdigit() and os.getppid() != int(expected):
        try:
            os.kill(int(expected), 0)
        except ProcessLookupError:  # the launcher died before the prctl above
            os._exit(128 + signal.SIGKILL)
        except PermissionError:
            pass


def _user_traceback(tb):
    """Drop the bootstrap's and runpy's frames from the front of a traceback."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name not in _SKIP_FILES and os.path.abspath(name) not in _SKIP_FILES:
            break
        tb = tb.tb_next
    return tb


def _int_env(name: str) -> int | None:
    raw = os.environ.get(name, "")
    return int(raw) if raw.lstrip("-").isdigit() else None


# hccl's errors by class name (this module imports nothing of npusim): the kind of failure
_HCCL_KINDS = (("HcclTimeoutError", "timeout"), ("CollectiveMismatchError", "mismatch"),
               ("RemoteRankError", "released"), ("HcclError", "hccl"))


def error_record(exc: BaseException) -> dict:
    """The typed record of a rank's failure, for the error file's ``error`` field.

    ``kind``: ``timeout`` / ``mismatch`` / ``released`` (a peer's failure or the launcher's
    abort released this rank) / ``hccl`` (another collective error) / ``exception`` (anything
    else); ``type``: the exception's class (hccl's own for a failed stream task); ``rank``;
    ``text``: the first line of the message; for ``released``, ``abort``: the typed abort record
    that released it (kind, rank, text), when the error carries one.
    """
    names = [c.__name__ for c in type(exc).__mro__]
    kind, type_name = "exception", type(exc).__name__
    for cls_name, k in _HCCL_KINDS:
        if cls_name in names:
            kind, type_name = k, cls_name
            break
    if kind == "hccl":      # the most derived hccl class, not the combined TaskError[...]
        type_name = next((n for n in names if not n.startswith("TaskError")), type_name)
    text = str(exc).splitlines()[0] if str(exc) else ""
    rec = {"kind": kind, "type": type_name, "rank": _int_env("RANK"), "text": text}
    if kind == "mismatch" and getattr(exc, "calls", None):    # the calls the rank compared
        rec["ranks"] = [r if isinstance(r, int) else None for r in getattr(exc, "ranks", [])]
        rec["calls"] = [str(c) for c in exc.calls]
    abort = getattr(exc, "abort", None)
    if isinstance(abort, dict):
        rec["abort"] = {k: abort.get(k) for k in ("kind", "rank", "text")}
    return rec


def write_error_file(exc: BaseException, tb_text: str, path: str | None = None) -> None:
    """Write the torchrun error-file JSON for ``exc`` (fields torchrun reads, plus ours:
    ``error``, the typed record of ``error_record``)."""
    path = path or os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time()
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": tb_text, "timestamp": str(int(now))},
        },
        "error": error_record(exc),
        "rank": _int_env("RANK"),
        "local_rank": _int_env("LOCAL_RANK"),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "timestamp": now,
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)  # the launcher never reads a half-written file
    except OSError as e:
        print(f"launcher.worker: cannot write error file {path}: {e}", file=sys.stderr)


def _excepthook(exc_type, exc, tb) -> None:
    tb = _user_traceback(tb)
    if exc is not None:
        exc = exc.with_traceback(tb)
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    if not issubclass(exc_type, KeyboardInterrupt):
        write_error_file(exc, text)
    sys.stderr.write(_console_text(exc, text))
    sys.stderr.flush()


def _console_text(exc: BaseException | None, text: str) -> str:
    """What the console gets of an uncaught exception.

    A collective error under npurun is one line: npurun's verdict tells the story, and the
    chained tracebacks of every rank would bury it. The full traceback goes to
    ``traceback.log`` next to the error file. Any other exception prints in full, as Python
    does.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if exc is None or not path or error_record(exc)["kind"] == "exception":
        return text
    tb_path = os.path.join(os.path.dirname(path), "traceback.log")
    try:
        with open(tb_path, "w") as f:
            f.write(text)
    except OSError:
        return text
    rec = error_record(exc)
    return f"{rec['type']}: {rec['text']} (full traceback: {tb_path})\n"


def _install_stack_dump() -> None:
    global _stack_file
    faulthandler.enable(all_threads=True)
    path = os.environ.get("NPUSIM_STACK_FILE")
    if not path or not hasattr(signal, "SIGUSR1"):
        return
    pending = f"{path}.pending"
    try:
        _stack_file = open(pending, "a")
        # what faulthandler restores at interpreter exit: a late request then cannot kill
        # an exiting rank (SIGUSR1's default action) and pass it off as a signal death
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True, chain=False)
        os.replace(pending, path)  # the final name announces: SIGUSR1 is safe now
    except OSError as e:
        print(f"launcher.worker: no stack dumps ({path}: {e})", file=sys.stderr)


def bootstrap() -> None:
    """Install the guard, the error hook and the stack dump (see the module docstring)."""
    _set_parent_death_signal()
    sys.excepthook = _excepthook
    _install_stack_dump()


def _run_script(path: str, args: list[str]) -> None:
    # what `python SCRIPT` does: its directory first on sys.path, argv[0] = the script
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    sys.argv = [path, *args]
    runpy.run_path(path, run_name="__main__")


def _run_module(name: str, args: list[str]) -> None:
    # `python -m` leaves the working directory first on sys.path (it already is)
    sys.argv = [name, *args]
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def _run_spawn(payload_path: str, result_path: str) -> None:
    import pickle
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)  # a dict of builtins written by our own parent (0700 temp dir)
    if payload.get("cwd"):
        os.chdir(payload["cwd"])
    sys.path[:] = list(payload["sys_path"]) + [p for p in sys.path if p not in payload["sys_path"]]
    import cloudpickle
    fn, args = cloudpickle.loads(payload["fn"])
    value = fn(int(os.environ["RANK"]), *args)
    tmp = f"{result_path}.tmp"
    with open(tmp, "wb") as f:
        f.write(cloudpickle.dumps(value))
    os.replace(tmp, result_path)


def main(argv: list[str]) -> None:
    usage = "usage: python -m launcher.worker [-m MODULE | --exec PROG | --spawn P R | SCRIPT] ARGS"
    if not argv:
        sys.exit(usage)
    bootstrap()
    mode, rest = argv[0], argv[1:]
    if mode == "--exec":
        if not rest:
            sys.exit(usage)
        os.execvp(rest[0], rest)  # the parent-death signal survives exec
    elif mode in ("-m", "--module"):
        if not rest:
            sys.exit(usage)
        _run_module(rest[0], rest[1:])
    elif mode == "--spawn":
        if len(rest) != 2:
            sys.exit(usage)
        _run_spawn(rest[0], rest[1])
    else:
        _run_script(mode, rest)


if __name__ == "__main__":
    main(sys.argv[1:])
