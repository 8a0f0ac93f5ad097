"""The launch-policy table of #37: npurun's scheduling policies, on an idle and a shared machine.

    python -m benchmarks.launch_policy [--rounds 3] [--loads 0,1,2] [--world 4] [--figures]

For each load (0, 1 or 2 other programs each keeping a core busy: ``python3 -c "while True:
pass"``, started here and killed by pid afterwards) and each round, every policy runs once, in
an order rotated per round (policies interleaved, so a change of the machine's background load
hits them all alike): ``npurun --nproc-per-node W -m hccl.bench --sizes 1K,64K --timing
median``, each rank first idle for ``--settle`` s (npurun's watcher takes its first decision
within ~1 s of the start: the figures are the steady state a job sees, not its first second).
A cell is the median over rounds of the bench's 1 KiB / 64 KiB medians; the load average and
the other programs' CPU use before the load's runs (in cores, as npurun's watcher measures it)
are recorded per load. Policies (environment of npurun):

    default          nothing set: npurun's watcher (launcher/agent/schedwatch.py): SCHED_BATCH and
                     one core per rank pair while other programs use < 0.3 cores, else the
                     default class on the cores they leave free
    nothing          NPUSIM_BIND=0 NPUSIM_SCHED_BATCH=0 (npurun's default between #37's steps)
    bind only        NPUSIM_BIND=1 NPUSIM_SCHED_BATCH=0
    batch only       NPUSIM_BIND=0 NPUSIM_SCHED_BATCH=1
    batch+bind       NPUSIM_SCHED_BATCH=1 NPUSIM_BIND=1 (npurun's default before #37)
    watch off        NPUSIM_SCHED_WATCH=0: the same as nothing, set another way (the noise
                     gauge: their spread is the run's noise)
    watch batch      NPUSIM_BIND=1: one core per rank pair always, the watcher moving only
                     the class (SCHED_BATCH while the machine is quiet)

``--figures`` puts the table on docs/figures.md (section "launch-policy"). A benchmark, not a
test: figures depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KNOBS = ("NPUSIM_BIND", "NPUSIM_SCHED_BATCH", "NPUSIM_SCHED_WATCH", "NPUSIM_SCHED_WATCH_CORES")
POLICIES = {
    "default": {},
    "nothing": {"NPUSIM_BIND": "0", "NPUSIM_SCHED_BATCH": "0"},
    "bind only": {"NPUSIM_BIND": "1", "NPUSIM_SCHED_BATCH": "0"},
    "batch only": {"NPUSIM_BIND": "0", "NPUSIM_SCHED_BATCH": "1"},
    "batch+bind": {"NPUSIM_SCHED_BATCH": "1", "NPUSIM_BIND": "1"},
    "watch off": {"NPUSIM_SCHED_WATCH": "0"},
    "watch batch": {"NPUSIM_BIND": "1"},
}
COLUMNS = tuple(POLICIES)
SIZES = (1024, 65536)


def run_once(world: int, env_extra: dict, iters: int, timeout: float,
             settle: float = 1.0) -> dict[int, float]:
    """{bytes: median us} of one npurun job, or {} when it failed."""
    fd, path = tempfile.mkstemp(prefix="npusim-policy-", suffix=".json")
    os.close(fd)
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env.update(env_extra)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "-m",
           "benchmarks.launch_policy", "--settled", str(settle),
           "--sizes", ",".join(str(s) for s in SIZES), "--timing", "median", "-n", str(iters),
           "-w", "20", "-c", "0", "--json", path]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            sys.stderr.write(f"launch_policy: {env_extra}: npurun exited {out.returncode}:\n"
                             f"{out.stderr[-2000:]}\n")
            return {}
        with open(path) as f:
            rows = json.load(f)["results"]
        return {r["bytes"]: r["time_us"] for r in rows}
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"launch_policy: {env_extra}: {e}\n")
        return {}
    finally:
        os.unlink(path)


def table(names, loads, runs, loadavg, used) -> tuple[list, list]:
    """The markdown table's head and rows: one row per load, one cell per policy, and the
    default's ratio to the best policy of the row per size."""
    head = ["machine"] + names + ["default vs best"]
    rows = []
    for load in loads:
        cells, med = [], {}
        for name in names:
            vals = []
            for s in SIZES:
                xs = [g[s] for g in runs[(load, name)] if s in g]
                med[(name, s)] = statistics.median(xs) if xs else None
                vals.append(f"{med[(name, s)]:,.0f}" if xs else "failed")
            cells.append(" / ".join(vals))
        ratios = []
        for s in SIZES:
            got = [med[(n, s)] for n in names if med[(n, s)] is not None]
            d = med.get(("default", s))
            ratios.append(f"{d / min(got):.2f}" if d is not None and got else "-")
        what = "no busy loop" if load == 0 else f"{load} core(s) busy"
        rows.append([f"{what} (loadavg {loadavg[load]:.1f}, others {used[load]:.2f})"] + cells
                    + [" / ".join(ratios)])
    return head, rows


def hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


def others(seconds: float = 1.0) -> float:
    """The other programs' CPU use of this process's cores over ``seconds``, in cores (as
    npurun's watcher measures it), or nan where /proc is missing."""
    try:
        from launcher.agent.schedwatch import CpuProbe  # noqa: PLC0415
        probe = CpuProbe(os.sched_getaffinity(0))
        probe((os.getpid(),))
        time.sleep(seconds)
        return probe((os.getpid(),))
    except (OSError, ImportError):
        return float("nan")


def settled(argv: list[str]) -> int:
    """A rank's side: idle ``argv[0]`` s, then hccl.bench with the rest."""
    from hccl import bench  # noqa: PLC0415
    time.sleep(float(argv[0]))
    return bench.main(argv[1:]) or 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--settled"]:
        return settled(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m benchmarks.launch_policy",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loads", default="0,1,2", help="busy-core counts to measure, e.g. 0,1")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds each rank idles before the bench (the watcher decides)")
    ap.add_argument("--figures", action="store_true",
                    help="put the table on docs/figures.md (section launch-policy)")
    ap.add_argument("--policies", default=",".join(COLUMNS))
    ap.add_argument("--json", default=None, help="write every run's figures here")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.world < 1 or a.iters < 1:
        ap.error(f"--rounds, --world and --iters must be >= 1, got {a.rounds}, {a.world}, "
                 f"{a.iters}")
    names = [p.strip() for p in a.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        ap.error(f"--policies: unknown {unknown}; known: {', '.join(POLICIES)}")
    loads = [int(x) for x in a.loads.split(",")]
    runs: dict = {}
    loadavg: dict = {}
    used: dict = {}
    for load in loads:
        busy = hogs(load)
        try:
            time.sleep(0.5)
            used[load] = others(1.0)
            seen = []
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    seen.append(float(open("/proc/loadavg").read().split()[0]))
                    got = run_once(a.world, POLICIES[name], a.iters, 300, a.settle)
                    runs.setdefault((load, name), []).append(got)
                    print(f"# load {load} round {r} {name:>10}: "
                          + "  ".join(f"{s // 1024} KiB {got.get(s, float('nan')):8.1f} us"
                                      for s in SIZES), flush=True)
            loadavg[load] = statistics.median(seen)
        finally:
            stop(busy)
    head, rows = table(names, loads, runs, loadavg, used)
    title = (f"world {a.world}, all_reduce, hccl.bench --timing median (us, median of "
             f"{a.rounds} interleaved rounds; 1 KiB / 64 KiB)")
    print(f"\n{title}\n")
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---|" * (len(head) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if a.figures:
        from benchmarks import figures  # noqa: PLC0415
        shown = [x for i, x in enumerate(argv) if x != "--json" and argv[i - 1:i] != ["--json"]]
        command = ("python -m benchmarks.launch_policy " + " ".join(shown)).strip()
        figures.write_section(
            "launch-policy", "npurun's launch policy (#37): " + title, command, head, rows,
            "default: npurun's watcher (launcher/schedwatch.py): SCHED_BATCH and one core per "
            "rank pair while other programs use < 0.3 cores, above the default class on the "
            "cores they leave free; nothing: NPUSIM_BIND=0 NPUSIM_SCHED_BATCH=0; batch+bind: "
            "npurun's default before #37; watch off: NPUSIM_SCHED_WATCH=0, the same as nothing "
            "set another way (their spread is the run's noise). 'others' is the other programs' "
            "CPU use (cores) measured before the load's runs, the busy loops included; 'vs "
            "best' is the default's 1 KiB / 64 KiB time over the best policy's of the same row "
            "(same run).")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{k[0]}|{k[1]}": v for k, v in runs.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
