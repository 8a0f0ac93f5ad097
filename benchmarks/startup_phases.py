"""Where start-up goes at a big world: a timeline of npurun and its ranks, phase by phase.

    python -m benchmarks.startup_phases [--world 64] [--fresh]

Runs npurun in this process (``launcher.cli.main``) with a job whose ranks initialise, run one
1 KiB AllReduce and exit, and prints, in seconds from the start of ``npurun``:
npurun's own phases (rendezvous, fork server ready, first and last rank started, every rank
exited, npurun returned) and, over the ranks, the median and latest time each rank reached its
phases (process start, script start, set_device, init_comm's steps, first collective, destroy,
end of the script). The steps of init_comm are timed by wrapping ``hccl.init``'s helpers in the
rank (nothing in npusim is changed). A tool for finding the slow step, not a benchmark table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import threading
from collections import Counter
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK = """
import json, os, sys, time
_t = {{"script": time.time()}}
def _clock_start():
    # the process's start, from /proc (ticks since boot) and the boot time
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = next(int(l.split()[1]) for l in f if l.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")
_t["process"] = _clock_start()
import atexit, threading
def _at_exit():   # registered first: runs last of the atexit handlers
    _t["atexit_end"] = time.time()
    with open(os.path.join({out!r}, f"e{{os.environ['RANK']}}.json"), "w") as f:
        json.dump(_t, f)
atexit.register(_at_exit)
import numpy as np
import hccl, runtime
from hccl import init as _init
_t["imports"] = time.time()
def _wrap(mod, name, label):
    fn = getattr(mod, name)
    def timed(*a, **k):
        n = sum(1 for key in _t if key.startswith(label))
        key = label if n == 0 else f"{{label}}#{{n}}"
        r = fn(*a, **k)
        _t[key] = time.time()
        return r
    setattr(mod, name, timed)
_wrap(_init, "StoreClient", "init.store_client")
_wrap(_init, "_transport", "init.transport")
_wrap(_init, "_wait_all", "init.wait_all")
_wrap(_init, "_table", "init.table")
from hccl.transport.process import ProcessTransport as _PT
_wrap(_PT, "connect", "init.connect")
runtime.set_device(int(os.environ["LOCAL_RANK"]))
_t["set_device"] = time.time()
comm = hccl.init_comm()
_t["init_comm"] = time.time()
x = runtime.to_device(np.ones(256, np.float32))
comm.all_reduce(x)
_t["first_collective"] = time.time()
comm.destroy()
_t["destroy"] = time.time()
_t["threads_at_end"] = [t.name for t in threading.enumerate()]
with open(os.path.join({out!r}, f"r{{comm.rank}}.json"), "w") as f:
    json.dump(_t, f)
"""

ORDER = ("process", "script", "imports", "set_device", "init.store_client", "init.transport",
         "init.wait_all", "init.table", "init.connect", "init.wait_all#1", "init_comm",
         "first_collective", "destroy", "atexit_end")


def _instrument_launcher(marks: dict) -> None:
    """Time npurun's own steps by wrapping them (this process only)."""
    from launcher import agent  # noqa: PLC0415
    from launcher.procs import forkclient, proc  # noqa: PLC0415

    def wrap(owner, name, label, *, every=False):
        fn = getattr(owner, name)

        def timed(*a, **k):
            marks.setdefault(label + ".begin", time.time())
            r = fn(*a, **k)
            if every:
                marks.setdefault(label + ".first", time.time())
                marks[label + ".last"] = time.time()
            else:
                marks[label] = time.time()
            return r
        setattr(owner, name, timed)

    wrap(forkclient.ForkServer, "__init__", "fork_server_ready")
    from launcher.agent import diagnose  # noqa: PLC0415
    orig_states = diagnose.Diagnoser.states

    def states(self):
        t = time.time()
        out = orig_states(self)
        marks.setdefault("_states", []).append((t, time.time() - t, len(out)))
        return out
    diagnose.Diagnoser.states = states
    wrap(proc.WorkerProcess, "start", "rank_started", every=True)
    wrap(agent.Agent, "_start_workers", "all_started")
    orig_reap = agent.Agent._reap

    def reap(self):
        out = orig_reap(self)
        if self.workers and all(not w.proc.alive() for w in self.workers):
            marks.setdefault("all_exited", time.time())
            marks["_exits"] = [w.proc.exited_at for w in self.workers]
        return out
    agent.Agent._reap = reap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.startup_phases",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--fresh", action="store_true", help="NPUSIM_FORKSERVER=0")
    ap.add_argument("--sample", type=float, nargs=2, metavar=("FROM", "TO"),
                    help="print where npurun's main thread was between these seconds")
    a = ap.parse_args(argv)
    if a.world < 1:
        raise SystemExit(f"--world must be >= 1, got {a.world}")
    os.environ["NPUSIM_FORKSERVER"] = "0" if a.fresh else "1"
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                       if os.environ.get("PYTHONPATH") else "")
    out = tempfile.mkdtemp(prefix="npusim-phases-")
    script = os.path.join(out, "job.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(RANK.format(out=out)))
    marks: dict = {}
    load0 = open("/proc/loadavg").read().split()[0]
    t0 = time.time()
    _instrument_launcher(marks)
    from launcher.cli import main as npurun  # noqa: PLC0415
    samples = []
    done = threading.Event()
    main_id = threading.get_ident()

    def sample():       # where npurun's main thread is, every 20 ms
        while not done.wait(0.02):
            f = sys._current_frames().get(main_id)
            where = []
            while f is not None and len(where) < 4:
                where.append(f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}")
                f = f.f_back
            samples.append((time.time(), " < ".join(where)))
    sampler = threading.Thread(target=sample, daemon=True)
    if a.sample:
        sampler.start()
    code = npurun(["--nproc-per-node", str(a.world), script])
    done.set()
    marks["npurun_returned"] = time.time()
    ranks = []
    for r in range(a.world):
        try:
            with open(os.path.join(out, f"e{r}.json")) as f:
                ranks.append(json.load(f))
        except OSError:
            pass
    for name in os.listdir(out):
        os.unlink(os.path.join(out, name))
    os.rmdir(out)
    print(f"world {a.world}, {'fresh interpreters' if a.fresh else 'fork server'}, exit code "
          f"{code}, {len(ranks)} rank timelines; load average {load0} at the start, "
          f"{open('/proc/loadavg').read().split()[0]} at the end")
    print("npurun (s from its start):")
    exits = marks.pop("_exits", [])
    polls = marks.pop("_states", [])
    if polls:
        print("npurun's reads of the ranks' states (diagnose.states): "
              + ", ".join(f"{t - t0:.1f}s:{d * 1000:.0f}ms/{n}" for t, d, n in polls))
    for k, v in sorted(marks.items(), key=lambda kv: kv[1]):
        print(f"  {k:28s} {v - t0:7.2f}")
    print("ranks (s from npurun's start):      median    latest   (earliest)")
    for k in ORDER:
        vals = [r[k] - t0 for r in ranks if k in r]
        if vals:
            print(f"  {k:30s} {statistics.median(vals):7.2f}  {max(vals):7.2f}   "
                  f"({min(vals):.2f})")
    if ranks:
        print("threads of rank 0 at the script's end:", ranks[0].get("threads_at_end"))
    if exits:
        vals = [e - t0 for e in exits]
        print(f"  {'exit seen by npurun':30s} {statistics.median(vals):7.2f}  {max(vals):7.2f}   "
              f"({min(vals):.2f})")
    if a.sample:
        lo, hi = a.sample
        hist = Counter(w for t, w in samples if lo <= t - t0 <= hi)
        print(f"npurun's main thread between {lo} and {hi} s ({sum(hist.values())} samples):")
        for w, n in hist.most_common(8):
            print(f"  {n:4d}  {w}")
    return code


if __name__ == "__main__":
    sys.exit(main())
