"""The fork server (launcher/procs/forkserver.py): ranks forked from one prepared process, and what
users do to it: a rank crashing at import, a script that does not compile, Ctrl-C during
start-up, restarts after a forked rank or the server itself died. Nothing is left behind."""
from __future__ import annotations

import json
import os
import signal
import textwrap

import pytest

from tests.leakcheck import LeakCheck, run_npurun, start_npurun, tagged_pids, wait_for

PROBE = """
import json, os, sys, threading
preloaded = "hccl.comm" in sys.modules and "numpy" in sys.modules
import numpy as np
import hccl, runtime
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
x = runtime.to_device(np.ones(4, np.float32))
comm.all_reduce(x)
rec = {"rank": int(os.environ["RANK"]), "pid": os.getpid(), "ppid": os.getppid(),
       "pgid": os.getpgid(0), "preloaded": preloaded, "draw": int(np.random.randint(1 << 62)),
       "sum": float(x.to_host()[0]), "argv": sys.argv, "main": __name__}
comm.destroy()
with open(os.path.join(OUT, f"rank{comm.rank}.json"), "w") as f:
    json.dump(rec, f)
"""


def _script(tmp_path, text: str, name: str = "job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fork", ["1", "0"])
def test_ranks_are_forked_from_one_prepared_process(tmp_path, fork):
    script = _script(tmp_path, PROBE.replace("OUT", repr(str(tmp_path))))
    with LeakCheck() as lc:
        lc.env["NPUSIM_FORKSERVER"] = fork
        res = run_npurun("--nproc-per-node", "4", script, "a1", env=lc.env, cwd=str(tmp_path),
                         timeout=220)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["rank"] for r in recs] == [0, 1, 2, 3]
    assert all(r["sum"] == 4.0 and r["argv"] == [script, "a1"] and r["main"] == "__main__"
               for r in recs)
    assert all(r["pgid"] == r["pid"] for r in recs)          # each rank in its own session
    assert len({r["draw"] for r in recs}) == 4                # numpy's generator was reseeded
    parents = {r["ppid"] for r in recs}
    assert len(parents) == 1
    if fork == "1":
        assert all(r["preloaded"] for r in recs)              # imported once, by the server
    else:
        assert not any(r["preloaded"] for r in recs)


@pytest.mark.timeout(120)
def test_a_script_that_does_not_compile_fails_once_before_any_rank(tmp_path):
    script = _script(tmp_path, "import os\nprint('hi'\nx = 1\n")
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "4", script, env=lc.env, timeout=100)
    assert res.returncode == 1
    assert res.stderr.count("SyntaxError") == 1, res.stderr
    assert "no rank was started" in res.stderr and "line 2" in res.stderr
    assert "[rank" not in res.stderr + res.stdout


@pytest.mark.timeout(240)
def test_a_rank_crashing_at_import_fails_the_job_and_leaves_nothing(tmp_path):
    script = _script(tmp_path, """
        import ctypes, os, time
        if os.environ["RANK"] == "1":
            ctypes.string_at(0)          # SIGSEGV while the script is being imported
        time.sleep(60)
        """)
    with LeakCheck() as lc:
        lc.env["NPUSIM_STOP_GRACE"] = "5"
        res = run_npurun("--nproc-per-node", "4", script, env=lc.env, timeout=220)
    assert res.returncode == 128 + signal.SIGSEGV, res.stderr[-3000:]
    assert "rank      : 1 (local_rank: 1)" in res.stderr, res.stderr[-3000:]
    assert "Stopped by npurun after the failure: ranks 0, 2, 3" in res.stderr, res.stderr[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("when", ["server", "ranks"])
def test_ctrl_c_during_start_up_stops_everything(tmp_path, when):
    """SIGINT as soon as the fork server runs (it may still be importing), or as soon as the
    ranks exist (they may still be importing): npurun exits 130 and nothing is left."""
    script = _script(tmp_path, """
        import os, time
        open(os.path.join({out!r}, "started." + os.environ["RANK"]), "w").close()
        time.sleep(120)
        """.format(out=str(tmp_path)))
    with LeakCheck() as lc:
        lc.env["NPUSIM_STOP_GRACE"] = "10"
        p = start_npurun("--nproc-per-node", "4", script, env=lc.env)
        try:
            if when == "server":
                wait_for(lambda: any(b"--fork-server" in _cmdline(pid)
                                     for pid in tagged_pids(lc.tag)) or p.poll() is not None,
                         60, 0.005, "the fork server to start")
            else:
                wait_for(lambda: any(f.name.startswith("started.") for f in tmp_path.iterdir())
                         or p.poll() is not None, 60, 0.005, "a rank to start")
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert p.returncode == 130, err[-3000:]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("who", ["rank", "server"])
def test_max_restarts_after_a_forked_rank_or_the_server_died(tmp_path, who):
    """Attempt 0: rank 1 is SIGKILLed (or it SIGKILLs the fork server, and every rank dies by
    its parent-death signal); attempt 1 runs to the end, from a new server if the old died."""
    script = _script(tmp_path, """
        import os, signal, time
        import hccl, runtime
        if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
            os.kill(os.getpid() if {who!r} == "rank" else os.getppid(), signal.SIGKILL)
            time.sleep(60)
        runtime.set_device(int(os.environ["LOCAL_RANK"]))
        comm = hccl.init_comm()
        comm.barrier()
        runtime.synchronize()
        comm.destroy()
        print("done", os.environ["RANK"], flush=True)
        """.format(who=who))
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "4", "--max-restarts", "1", script, env=lc.env,
                         timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "restarting the job: attempt 1" in res.stderr, res.stderr[-3000:]
    assert all(f"[rank {r}]: done {r}" in res.stdout for r in range(4)), res.stdout
    if who == "server":
        assert "the fork server" in res.stderr and "died; starting a new one" in res.stderr, \
            res.stderr[-3000:]


ENDING = """
import atexit, os, sys, threading
out, r = {out!r}, os.environ["RANK"]
with open("/proc/self/environ", "rb") as f:
    shown = dict(p.split("=", 1) for p in f.read().decode().split("\\0") if "=" in p)
assert shown == dict(os.environ), sorted(set(shown.items()) ^ set(os.environ.items()))[:6]
log = open(os.path.join(out, "unclosed." + r), "w")      # never closed: flushed at the end
log.write("kept")
atexit.register(lambda: log.write(" by atexit"))
go = threading.Event()
def late():             # a non-daemon thread: joined before the process ends
    go.wait(60)
    open(os.path.join(out, "thread." + r), "w").close()
threading.Thread(target=late).start()
go.set()
if r == "1":
    {end}
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("end,code", [("pass", 0), ("sys.exit(3)", 3), ("sys.exit('bye')", 1),
                                      ("raise ValueError('no')", 1),
                                      ("raise KeyboardInterrupt", 128 + signal.SIGINT)])
def test_a_forked_rank_ends_as_python_would(tmp_path, end, code):
    """A forked rank skips the interpreter's teardown (launcher.procs.forkserver, "How a forked rank
    ends") but not what a script relies on: its exit status, atexit handlers, non-daemon
    threads, files left open; and /proc/PID/environ shows its own environment."""
    script = _script(tmp_path, ENDING.format(out=str(tmp_path), end=end))
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "3", script, env=lc.env, timeout=220)
    assert res.returncode == code, res.stderr[-3000:]
    # after a failure npurun stops the other ranks (SIGTERM): only rank 1 ended by itself
    for r in range(3) if code == 0 else [1]:
        assert (tmp_path / f"unclosed.{r}").read_text() == "kept by atexit", res.stderr[-3000:]
        assert (tmp_path / f"thread.{r}").exists()
    if end.startswith("sys.exit('"):
        assert "[rank 1]: bye" in res.stderr
    if code == 1:
        assert "rank      : 1" in res.stderr
