"""Where an eager small AllReduce's microseconds go: ``npurun --nproc-per-node 2 -m
benchmarks.percall [--bytes 1024] [--json OUT]``, or ``python -m benchmarks.percall --worlds 2,4``
for a table of several worlds against the floor measured in the same run.

Each figure is a median over ``--calls`` calls (every rank runs them together), taken apart
into what a user's call pays:

- ``issue``: the host's part of ``comm.all_reduce`` (checks, the plan lookup, the sequence
  number, the flight record, the enqueue), timed while the stream is held behind a gate, so
  nothing else runs (and, the stream being busy, nothing of the exchange begins at the call:
  ``eager`` includes the sends an idle stream's call posts, see hccl/call.py);
- ``stream``: a no-op kernel's ``launch`` + ``synchronize``: the hand-off to the stream's worker
  and the two wake-ups, one rank, no peer;
- ``replay``: a task graph of that one AllReduce replayed + synchronize: the stream plus the
  exchange with the peers, without the per-call host work;
- ``eager``: ``comm.all_reduce`` + ``synchronize``, the whole, timed in ``BLOCKS`` blocks that
  alternate with blocks of the floor's swap-and-add (``benchmarks.floor.Swaps``) run by ranks 0
  and 1 of this very job where the ranks fit the cores (``floor_job``: the same processes,
  cores and moments, so the machine's drift moves both alike);
- ``exchange`` = replay - stream: the messages, the peers' wake-ups and the reduction;
- ``cpu``: the CPU time of the whole process per eager call (``time.process_time``, every
  thread, spinning waits included): steadier than the medians on a shared machine, since time
  spent waiting for a core is not counted;
- ``at call``: the fraction of those eager calls already complete when ``all_reduce`` returned
  (run whole in the caller, hccl/call.py's ``begin``: no task, no hand-off to the worker).

and, for a step of 8 such calls, eager against the fused replay (benchmarks.graph_step).
What one eager call costs in Python is counted too, on every thread of the rank (the task may
run on the caller's thread or the stream's worker):

- ``frames``: Python function calls per eager call (``sys.setprofile`` "call" events);
- ``allocs``: memory blocks allocated per eager call and still held at the next Python call
  or return (``sys.getallocatedblocks`` read at every profile event, the rises summed): a lower
  bound of the objects a call makes, since objects made and freed between two events, and those
  CPython recycles through its free lists (tuples, lists, dicts, frames), are not seen;
- ``growth``: bytes still held after 1000 more eager calls (``tracemalloc``), per call, once
  the flight recorder's ring (NPUSIM_TRACE_BUFFER records) is full: 0 when nothing accumulates.

Rank 0 prints one line per figure and, with ``--json``, writes them. With ``--floor`` rank 0
first measures ``benchmarks.floor`` apart (two plain processes; the other ranks wait in a
barrier) and prints the eager call's ratio to it; ``--worlds`` measures that floor and runs
npurun once per world, alternately, and prints the table (both floors and both ratios): with ``--base DIR`` another checkout (e.g. ``git -C REPO archive main | tar -x -C DIR``)
runs just before this one at each world, as *before* (this file measures both: its path
runs with the other checkout first on PYTHONPATH); ``--rounds N`` repeats it all and prints medians; ``--figures`` puts the table on
docs/figures.md (``benchmarks.figures.write_section("percall", ...)``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np

import hccl
import runtime
from benchmarks import floor, graph_step


def _noop():
    pass


def measure(comm, nbytes: int, calls: int, warmup: int) -> dict:
    """The figures of the module's docstring (us), on every rank."""
    s = runtime.Stream()
    x = runtime.to_device(np.ones(max(1, nbytes // 4), np.float32))
    op = hccl.ReduceOp.MAX                  # values stay put over many calls

    def eager():
        comm.all_reduce(x, op=op, stream=s)
        s.synchronize()

    def stream():
        runtime.launch(_noop, stream=s)
        s.synchronize()

    g = runtime.Graph("one")
    with runtime.graph(g, stream=s):
        comm.all_reduce(x, op=op, stream=s)

    def replay():
        g.replay(s)
        s.synchronize()

    eager_ts, floor_ts = _interleaved(comm, s, eager, nbytes, calls, warmup)
    out = {"stream_us": graph_step.median_us(stream, calls, warmup),
           "eager_us": statistics.median(eager_ts),
           "replay_us": graph_step.median_us(replay, calls, warmup)}
    if floor_ts:
        out["floor_job_us"] = statistics.median(floor_ts)
    out["exchange_us"] = out["replay_us"] - out["stream_us"]
    c0 = time.process_time()                # cpu: every thread of the rank, waits included
    done = 0
    for _ in range(calls):
        comm.all_reduce(x, op=op, stream=s)
        done += s.completed == s.issued     # done when all_reduce returned (hccl.call.begin)
        s.synchronize()
    out["cpu_us"] = (time.process_time() - c0) / calls * 1e6
    out["at_call"] = done / calls
    gate = threading.Event()                # issue: the stream waits behind the gate
    issue_ts = []
    for _ in range(max(1, calls // 50)):
        runtime.launch(gate.wait, stream=s)
        for _ in range(50):
            t0 = time.perf_counter()
            comm.all_reduce(x, op=op, stream=s)
            issue_ts.append(time.perf_counter() - t0)
        gate.set()
        s.synchronize()
        gate.clear()
    out["issue_us"] = statistics.median(issue_ts) * 1e6
    out.update(count(comm, x, op, max(50, calls // 10)))
    step = graph_step.measure(comm, s, 8, nbytes, max(50, calls // 4), 10)
    out.update({f"step8_{k}": v for k, v in step.items()})
    return out


BLOCKS = 10            # eager calls and the in-job floor alternate in this many blocks each


def _floor_module():
    """benchmarks/floor.py beside this file (with ``--base`` the other checkout's
    ``benchmarks`` package comes first on the path, and may predate ``floor.Swaps``)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "npusim_percall_floor", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "floor.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _interleaved(comm, s, eager, nbytes: int, calls: int, warmup: int) -> tuple[list, list]:
    """The microseconds of ``calls`` eager calls, and of as many of the floor's swaps run by
    ranks 0 and 1 of this very job, in ``BLOCKS`` alternating blocks of each: the same
    processes, cores and moments, so a machine whose speed drifts (this one's does, by tens
    of percent from second to second) moves both alike. Without the floor (one rank, or more
    ranks than cores: ranks share a core, and the floor's spin, which never yields, would wait
    for the scheduler's tick) the floor's list is empty."""
    for _ in range(warmup):
        eager()
    floor_mod = None
    if 2 <= comm.size <= (os.cpu_count() or 1) and len(os.sched_getaffinity(0)) >= 2:
        floor_mod = _floor_module()
    sw = None
    if floor_mod is not None:           # rank 0 makes the segment, the others learn its name
        path = floor_mod.create(nbytes) if comm.rank == 0 else None
        name = runtime.to_device(np.zeros(2, np.int64))
        if path is not None:
            pid, token = path.rsplit("-", 2)[1:]
            name.copy_from_host(np.array([int(pid), int(token, 16)], np.int64))
        comm.broadcast(name, root=0, stream=s)
        pid, token = (int(v) for v in name.to_host(stream=s))
        if comm.rank < 2:
            sw = floor_mod.Swaps(comm.rank, path or f"/dev/shm/npusim-floor-{pid}-{token:08x}",
                                 max(4, nbytes))
        comm.barrier(stream=s)
        s.synchronize()
        if path is not None:
            os.unlink(path)             # both ranks mapped it
    eager_ts, floor_ts = [], []
    per = max(1, calls // BLOCKS)
    try:
        for _ in range(BLOCKS):
            if sw is not None:
                floor_ts += sw.block(per)
            comm.barrier(stream=s)
            s.synchronize()
            for _ in range(per):
                t0 = time.perf_counter()
                eager()
                eager_ts.append((time.perf_counter() - t0) * 1e6)
    finally:
        if sw is not None:
            sw.close()
    return eager_ts, floor_ts


def count(comm, x, op, calls: int) -> dict:
    """Python frames and allocated blocks per eager ``comm.all_reduce(x) + synchronize`` (see
    the module note), on a fresh stream whose worker is profiled too."""
    n = {"frames": 0, "allocs": 0}
    last = [sys.getallocatedblocks()]
    blocks = sys.getallocatedblocks

    def prof(frame, event, arg):
        b = blocks()
        if b > last[0]:
            n["allocs"] += b - last[0]
        if event == "call":
            n["frames"] += 1
        last[0] = blocks()

    threading.setprofile(prof)          # the fresh stream's worker starts under it
    try:
        s = runtime.Stream()
        for _ in range(20):
            comm.all_reduce(x, op=op, stream=s)
            s.synchronize()
        comm.barrier(stream=s)
        s.synchronize()
        sys.setprofile(prof)
        n["frames"] = n["allocs"] = 0
        last[0] = blocks()
        for _ in range(calls):
            comm.all_reduce(x, op=op, stream=s)
            s.synchronize()
        sys.setprofile(None)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    out = {"frames": n["frames"] / calls, "allocs": n["allocs"] / calls}
    tracemalloc.start()
    try:
        for _ in range(hccl.config.trace_buffer() + 100):     # the recorder's ring fills up
            comm.all_reduce(x, op=op, stream=s)
            s.synchronize()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(1000):
            comm.all_reduce(x, op=op, stream=s)
            s.synchronize()
        out["growth"] = (tracemalloc.get_traced_memory()[0] - before) / 1000
    finally:
        tracemalloc.stop()
    s.destroy()
    return out


def _commit(checkout: str) -> str:
    """The short commit of a git checkout (a worktree or clone), "?" for a plain directory."""
    p = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else "?"


def _run(side: str | None, world: int, nbytes: int, calls: int) -> dict:
    """One npurun of this benchmark at ``world``; ``side``: another checkout whose runtime
    and hccl it measures (this very file runs, by its path), None for this one."""
    env = None if side is None else dict(os.environ, PYTHONPATH=side)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "percall.json")
        cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world)]
        cmd += ["-m", "benchmarks.percall"] if side is None else [os.path.abspath(__file__)]
        cmd += ["--bytes", str(nbytes), "--calls", str(calls), "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=side)
        with open(out) as f:
            return json.load(f)["results"]


FIGURES = ("frames", "allocs", "eager_us", "cpu_us", "issue_us", "stream_us", "exchange_us",
           "at_call", "floor_job_us")


def table(worlds: list[int], nbytes: int, calls: int, base: str | None = None,
          rounds: int = 1, figures: bool = False) -> int:
    """Measure the floor, then run npurun, for each world (and, with ``base``, the other
    checkout right after, alternately), ``rounds`` times; print one table of the medians over
    rounds (rank 0's figures) and, with ``figures``, put it on docs/figures.md."""
    sides = [("after", None)] if base is None else [("before", os.path.abspath(base)),
                                                    ("after", None)]
    got: dict = {}
    for _ in range(rounds):
        for w in worlds:
            floor_us = floor.measure(nbytes, 5000)  # here, between the runs: a plain program
            for name, side in sides:
                r = _run(side, w, nbytes, calls)
                cell = got.setdefault((w, name), {k: [] for k in FIGURES + ("floor_us",)})
                for k in FIGURES:
                    cell[k].append(r.get(k, 0.0))
                cell["floor_us"].append(floor_us)
    head = ["world", "side", "frames / call", "blocks / call", "eager us", "floor in job us",
            "eager / floor in job", "floor apart us", "eager / floor apart", "cpu us",
            "issue us", "stream us", "exchange us", "at call"]
    rows = []
    for w in worlds:
        for name, _ in sides:
            m = {k: statistics.median(v) for k, v in got[(w, name)].items()}
            job = m["floor_job_us"]
            rows.append([w, name, f"{m['frames']:.0f}", f"{m['allocs']:.1f}",
                         f"{m['eager_us']:.1f}", f"{job:.2f}" if job else "—",
                         f"{m['eager_us'] / job:.1f}x" if job else "—",
                         f"{m['floor_us']:.2f}", f"{m['eager_us'] / m['floor_us']:.1f}x",
                         f"{m['cpu_us']:.1f}", f"{m['issue_us']:.1f}",
                         f"{m['stream_us']:.1f}", f"{m['exchange_us']:.1f}",
                         f"{m['at_call']:.0%}"])
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    if figures:
        from benchmarks import figures as page
        cmd = (f"python -m benchmarks.percall --worlds {','.join(map(str, worlds))} --rounds "
               f"{rounds} --figures" + (" --base BEFORE" if base else ""))
        text = (f"An eager {nbytes} B AllReduce + synchronize, medians of {rounds} round(s) of "
                f"{calls} calls (rank 0). The floor is benchmarks.floor's swap-and-add of the "
                f"same bytes through shared memory: *in job*, run by ranks 0 and 1 of the "
                f"benchmark's own job in {BLOCKS} blocks alternating with blocks of the eager "
                f"calls (same processes, cores and moments; only where the ranks fit the cores: "
                f"the floor's spin never yields); *apart*, two plain processes between the runs "
                f"of each round. This machine's speed drifts by tens of percent from second to "
                f"second: compare ratios of the same run, the in-job one first, not "
                f"microseconds across runs." + (f" *before*: the checkout BEFORE (commit "
                                                f"`{_commit(base)}`), run alternately with "
                                                "*after*." if base else ""))
        page.write_section("percall", "Per-call cost of an eager small AllReduce", cmd, head,
                           rows, text)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--json", help="rank 0 writes the figures here")
    ap.add_argument("--floor", action="store_true",
                    help="rank 0 measures benchmarks.floor first, in the same run")
    ap.add_argument("--worlds", help="e.g. 2,4: run npurun per world (with --floor), one table")
    ap.add_argument("--base", help="with --worlds: another checkout (a directory), run "
                    "alternately with this one, its figures as 'before'")
    ap.add_argument("--rounds", type=int, default=1, help="with --worlds: rounds (medians)")
    ap.add_argument("--figures", action="store_true",
                    help="with --worlds: put the table on docs/figures.md (section percall)")
    a = ap.parse_args(argv)
    if a.worlds:
        return table([int(w) for w in a.worlds.split(",")], a.bytes, a.calls, a.base,
                     a.rounds, a.figures)
    runtime.set_device()
    comm = hccl.init_comm()
    floor_us = None
    if a.floor:
        s = runtime.Stream()
        if comm.rank == 0:
            floor_us = floor.measure(a.bytes, 5000)
        comm.barrier(stream=s)          # the others wait here meanwhile
        s.synchronize()
        s.destroy()
    r = measure(comm, a.bytes, a.calls, a.warmup)
    if comm.rank == 0:
        r.update(world=comm.size, bytes=a.bytes, calls=a.calls)
        for k in ("issue_us", "stream_us", "exchange_us", "replay_us", "eager_us", "cpu_us"):
            print(f"world {comm.size}, {a.bytes} B all_reduce, {k[:-3]:>9}: {r[k]:8.1f} us")
        print(f"world {comm.size}, eager calls complete when all_reduce returned: "
              f"{r['at_call']:.0%}")
        print(f"world {comm.size}, per eager call: {r['frames']:.0f} Python frames, "
              f"{r['allocs']:.1f} blocks allocated, {r['growth']:.1f} bytes held after")
        if "floor_job_us" in r:
            print(f"world {comm.size}: floor in this job (benchmarks.floor, interleaved) "
                  f"{r['floor_job_us']:.2f} us; eager {r['eager_us'] / r['floor_job_us']:.1f}x "
                  "the floor")
        if floor_us is not None:
            r["floor_us"] = floor_us
            print(f"world {comm.size}: floor (benchmarks.floor) {floor_us:.2f} us; eager "
                  f"{r['eager_us'] / floor_us:.1f}x the floor")
        print(f"world {comm.size}, step of 1 kernel + 8 x {a.bytes} B all_reduce: eager "
              f"{r['step8_eager_us']:.0f} us, replay {r['step8_replay_us']:.0f} us, fused replay "
              f"{r['step8_fused_replay_us']:.0f} us; results "
              f"{'right' if r['step8_ok'] else 'WRONG'}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"results": r}, f, indent=1)
    comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
