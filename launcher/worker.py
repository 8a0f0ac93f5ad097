"""Worker bootstrap: what runs first in every rank started by npurun or launcher.spawn.

    python -u -m launcher.worker SCRIPT ARGS...        run a script as __main__
    python -u -m launcher.worker -m MODULE ARGS...     run a module as __main__ (python -m)
    python -u -m launcher.worker --exec PROGRAM ARGS...   --no-python: guard, then exec PROGRAM
    python -u -m launcher.worker --spawn PAYLOAD RESULT   launcher.spawn: fn(rank, *args)
    python -u -m launcher.worker --fork-server FD      the node's fork server (procs.forkserver),
                                                       whose children become ranks as above

Before the user's code runs, the bootstrap installs, in this order:

1. the parent-death guard: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, then a check that the launcher
   (``NPUSIM_LAUNCHER_PID``) did not die before the prctl took effect. The launcher forks workers
   from its main thread, which lives as long as the launcher does (the signal follows the forking
   *thread*). The launcher's janitor process (``procs.janitor``) then kills the worker's whole
   process group and removes the job's shared memory.
2. an ``sys.excepthook`` that writes a torchrun-style error file to ``TORCHELASTIC_ERROR_FILE``
   (no ``@record`` decorator needed, with a typed ``error`` record) and prints the traceback
   without the bootstrap's frames; a collective (hccl) error prints as one line on the console,
   its full traceback going to ``traceback.log`` next to the error file.
3. the stack dump: fatal-signal tracebacks to stderr (``faulthandler``), and every thread's
   Python stack appended to ``NPUSIM_STACK_FILE`` on SIGUSR1, so the launcher can take stacks
   without the rank's help. SIGUSR1's handler is a Python one: faulthandler's dump, run by the
   main thread while it holds the GIL, when no other thread can push or pop a frame or end. A
   dump from the C signal handler (faulthandler.register) reads the other threads' frames while
   they run: with threads starting and ending it crashed the rank with SIGSEGV (4 of 29 signals
   to a churn program like ``tests/procs/test_stack_dump.py``'s; 0 of 2000 the Python way; the
   test's own churn rank died at the 6th dump the old way). A main thread
   that cannot run Python (stuck in a C call) answers SIGUSR2 instead, faulthandler's C dump,
   which the launcher sends only when SIGUSR1 went unanswered (``launcher.procs.stacks``). The
   file appears under its final name only once both handlers are in place, so the launcher never
   sends either signal (whose default action kills) before that.
4. the rank's command line as ``ps`` shows it: ``python -u SCRIPT ARGS`` (``-m MODULE ARGS``), as
   torchrun's ranks read, forked or not (``ps aux | grep train.py`` and ``pkill -f train.py``
   find the ranks), and its name ``rank<RANK>:<script>`` (15 bytes: ``top``, ``ps -o comm``).

Only the standard library is imported here, so start-up stays fast: ``hccl.failure`` (whose
package brings ``runtime``'s light init) only when a rank fails, ``cloudpickle`` in spawn mode
only.
"""
from __future__ import annotations

import atexit
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

from launcher import config
from launcher.procs.proctitle import show_command

_PR_SET_PDEATHSIG = 1
_stack_file = None  # kept open for faulthandler for the life of the process
_SKIP_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>",
               os.path.join(os.path.dirname(os.path.abspath(__file__)), "procs", "forkserver.py")}
# npusim's own packages: a frame there is not where the user's code raised
_OWN_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p)
                  + os.sep for p in ("runtime", "hccl", "launcher"))
_MAX_TEXT = 600


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the janitor still cleans up
        pass
    expected = str(config.launcher_pid() or "")
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
    raw = "" if config.worker_int(name) is None else str(config.worker_int(name))
    return int(raw) if raw.lstrip("-").isdigit() else None


def error_record(exc: BaseException) -> dict:
    """The typed record of a rank's failure, for the error file's ``error`` field.

    ``kind``: a ``hccl.failure.Failure`` word: ``timeout`` / ``mismatch`` / ``released`` (a
    peer's failure or the launcher's abort released this rank) / ``failed`` (another collective
    error) / ``error`` (the rank's own code raised: anything else, an argument error of an hccl
    call included); ``type``: the exception's class (hccl's own for a failed stream task);
    ``rank``; ``text``: the message on one line (for ``error`` its lines joined, at most 600
    characters; for a collective's error its headline);
    ``site``: ``file:line in function`` of the innermost frame of the user's code, when the
    exception carries a traceback; for ``released``, ``abort``: the typed abort record that
    released it (kind, rank, text), when the error carries one.
    """
    from hccl.failure import Failure, of_exception, origin
    site = user_site(exc.__traceback__)
    exc = origin(exc)       # npusim's error, when torch handed it on as a RuntimeError
    kind, type_name = of_exception(exc)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # a collective's message is a headline and indented details; the user's own error is read
    # whole (a message cut at its first newline can lose the reason)
    text = " ".join(lines) if kind is Failure.ERROR else (lines[0] if lines else "")
    if len(text) > _MAX_TEXT:
        text = text[:_MAX_TEXT - 3] + "..."
    rec = {"kind": kind.value, "type": type_name, "rank": _int_env("RANK"), "text": text}
    if site:
        rec["site"] = site
    if kind is Failure.MISMATCH and getattr(exc, "calls", None):    # the calls the rank compared
        rec["ranks"] = [r if isinstance(r, int) else None for r in getattr(exc, "ranks", [])]
        rec["calls"] = [str(c) for c in exc.calls]
    abort = getattr(exc, "abort", None)
    if isinstance(abort, dict):
        rec["abort"] = {k: abort.get(k) for k in ("kind", "rank", "text")}
    return rec


def user_site(tb) -> str | None:
    """``file:line in function`` of the innermost frame of ``tb`` outside npusim and the
    bootstrap: where the user's code made the call that raised."""
    site = None
    while tb is not None:
        code = tb.tb_frame.f_code
        name = os.path.abspath(code.co_filename)
        if name not in _SKIP_FILES and not name.startswith(_OWN_DIRS) \
                and not code.co_filename.startswith("<frozen"):
            site = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return site


def write_error_file(exc: BaseException, tb_text: str, path: str | None = None) -> None:
    """Write the torchrun error-file JSON for ``exc`` (fields torchrun reads, plus ours:
    ``error``, the typed record of ``error_record``)."""
    path = path or config.error_file()
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
    if _interrupt(exc) is None:
        write_error_file(exc, text)
    sys.stderr.write(_console_text(exc, text))
    sys.stderr.flush()


def _console_text(exc: BaseException | None, text: str) -> str:
    """What the console gets of an uncaught exception.

    A collective error under npurun is one line: npurun's verdict tells the story, and the
    chained tracebacks of every rank would bury it; so is a KeyboardInterrupt (npurun forwards
    a Ctrl-C to every rank: one line each, where it was). The full traceback goes to
    ``traceback.log`` next to the error file. Any other exception prints in full, as Python
    does.
    """
    from hccl.failure import Failure, of_exception
    path = config.error_file()
    interrupted = _interrupt(exc) is not None
    if exc is None or not path or (of_exception(exc)[0] is Failure.ERROR and not interrupted):
        return text
    tb_path = os.path.join(os.path.dirname(path), "traceback.log")
    try:
        with open(tb_path, "w") as f:
            f.write(text)
    except OSError:
        return text
    if interrupted:     # npurun forwarded a Ctrl-C: where the rank was is all the console needs
        site = user_site(_interrupt(exc).__traceback__) or user_site(exc.__traceback__)
        return (f"KeyboardInterrupt: stopped{f' at {site}' if site else ''} "
                f"(full traceback: {tb_path})\n")
    rec = error_record(exc)
    return f"{rec['type']}: {rec['text']} (full traceback: {tb_path})\n"


def _interrupt(exc: BaseException | None) -> BaseException | None:
    """The KeyboardInterrupt ``exc`` is or was caused by (a stream task the main thread ran
    when Ctrl-C came fails with it), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _dump_stacks(signum, frame) -> None:
    """SIGUSR1: every thread's stack, appended to the stack file, by the main thread holding the
    GIL (see the module docstring, 3.)."""
    f = _stack_file
    if f is not None:
        try:        # never an exception into the user's code, which the handler interrupted
            faulthandler.dump_traceback(f, all_threads=True)
            f.flush()
        except (OSError, ValueError):
            pass


def _quiet_stack_signals() -> None:
    """At exit: ignore SIGUSR1. The interpreter's finalization puts a Python handler back to
    the default action, and a late request must not kill an exiting rank (passing it off as a
    signal death). SIGUSR2 goes back to what faulthandler found: ignored."""
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    except (ValueError, OSError):   # not the main thread (an atexit run elsewhere): leave it
        pass


def _install_stack_dump() -> None:
    global _stack_file
    faulthandler.enable(all_threads=True)
    path = config.stack_file()
    if not path or not hasattr(signal, "SIGUSR1"):
        return
    pending = f"{path}.pending"
    try:
        _stack_file = open(pending, "a")
        signal.signal(signal.SIGUSR1, _dump_stacks)
        atexit.register(_quiet_stack_signals)
        # the fallback, for a main thread stuck in C: what faulthandler restores at interpreter
        # exit is SIG_IGN, so a late request cannot kill an exiting rank either
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        faulthandler.register(signal.SIGUSR2, file=_stack_file, all_threads=True, chain=False)
        os.replace(pending, path)  # the final name announces: both signals are safe now
    except OSError as e:
        print(f"launcher.worker: no stack dumps ({path}: {e})", file=sys.stderr)


def _withdraw_stack_dump() -> None:
    path = config.stack_file()
    if _stack_file is not None and path:
        try:
            os.unlink(path)
        except OSError:
            pass


def bootstrap() -> None:
    """Install the guard, the error hook and the stack dump (see the module docstring)."""
    _set_parent_death_signal()
    sys.excepthook = _excepthook
    _install_stack_dump()


def rank_command(mode: str, rest: list[str]) -> list[str]:
    """What a rank running ``mode rest`` shows in ``ps``: its interpreter, the interpreter's
    options, then the script (or ``-m MODULE``) and its arguments, as torchrun's ranks do
    (``python -u train.py --lr 0.1``), not this bootstrap's line."""
    orig = list(getattr(sys, "orig_argv", None) or [sys.executable, "-u"])
    opts = orig[1:orig.index("-m")] if "-m" in orig[1:] else ["-u"]
    target = ["-m", *rest] if mode in ("-m", "--module") else [mode, *rest]
    return [orig[0], *opts, *target]


def _name_rank(mode: str, rest: list[str]) -> None:
    """The rank's command line and name (``show_command``): ``rank3:train.py``."""
    if mode in ("--exec", "--spawn") or (mode in ("-m", "--module") and not rest):
        return      # --exec: the program's own line after exec; --spawn: launcher.spawn's
    target = rest[0] if mode in ("-m", "--module") else os.path.basename(mode)
    rank = config.rank()
    show_command(rank_command(mode, rest), f"rank{rank}:{target}" if rank is not None else target)


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
    value = fn(config.rank(), *args)
    tmp = f"{result_path}.tmp"
    with open(tmp, "wb") as f:
        f.write(cloudpickle.dumps(value))
    os.replace(tmp, result_path)


_USAGE = "usage: python -m launcher.worker [-m MODULE | --exec PROG | --spawn P R | SCRIPT] ARGS"


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(_USAGE)
    if argv[0] == "--fork-server":  # a rank's command line names the bootstrap, forked or not
        from launcher.procs import forkserver  # noqa: PLC0415
        argv = forkserver.main(argv[1:])     # returns in a forked rank, with its arguments
        forkserver.run_rank(_run, argv)      # it ends without the interpreter's teardown
        return
    _run(argv)


def _run(argv: list[str]) -> None:
    usage = _USAGE
    bootstrap()
    mode, rest = argv[0], argv[1:]
    _name_rank(mode, rest)
    if mode == "--exec":
        if not rest:
            sys.exit(usage)
        # the program after exec has neither stack handler (exec resets them to the default
        # action, which kills): its stack file goes, so npurun never asks it for stacks
        _withdraw_stack_dump()
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
