"""The figures page: ``benchmarks.compare``'s JSON rendered as markdown.

``python -m benchmarks.figures docs/figures.json > docs/figures.md`` re-renders a page from a
run's JSON; ``python -m benchmarks.compare --json J --page P`` (or ``bash benchmarks/compare.sh``)
writes both in one go. The page is generated: edit this module, not the page.
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import subprocess
import sys

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")

LABEL = {"npusim": "npusim", "gloo": "gloo", "mpi": "Open MPI", "ceiling": "ceiling"}


def human(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def table(run: dict) -> str:
    """The medians as a markdown table, with npusim's ratio to every other system (above 1:
    npusim better: peer time / npusim time, npusim busbw / peer busbw)."""
    systems = run["systems"]
    head = ["world", "collective", "size", "unit"] + [LABEL[s] for s in systems] + \
        [f"npusim / {LABEL[s]}" for s in systems[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in run["rows"]:
        lat = row["unit"] == "us"
        cells = [str(row["world"]), row["coll"], human(row["bytes"]), row["unit"]]
        cells += ["—" if row[s] is None else (f"{row[s]:,.1f}" if lat else f"{row[s]:.2f}")
                  for s in systems]
        for s in systems[1:]:
            mine, theirs = row["npusim"], row[s]
            cells.append("—" if not mine or not theirs else
                         f"{(theirs / mine if lat else mine / theirs):.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def percall(run: dict) -> str:
    """The section of ``benchmarks.percall``'s figures (empty when the run has none)."""
    pc = run.get("percall") or {}
    if not pc:
        return ""
    mpi = {r["world"]: r.get("mpi") for r in run["rows"]
           if r["coll"] == "all_reduce" and r["bytes"] == 1024}
    lines = ["", "## Where an eager 1 KiB AllReduce's microseconds go", "",
             "`benchmarks/percall.py`, in each round at each world, medians over rounds (us; "
             "the parts are explained in [docs/algorithms.md](algorithms.md#where-a-small-"
             "calls-time-goes)):", "",
             "| world | issue (host) | stream hand-off | exchange | eager call | "
             "eager / Open MPI | step of 8: eager | replay | fused replay | eager / fused |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for w, f in sorted(pc.items(), key=lambda kv: int(kv[0])):
        theirs = mpi.get(int(w))
        ratio = f"{f['eager_us'] / theirs:.1f}x" if theirs else "—"
        lines.append(
            f"| {w} | {f['issue_us']:.1f} | {f['stream_us']:.1f} | {f['exchange_us']:.1f} | "
            f"{f['eager_us']:.1f} | {ratio} | {f['step8_eager_us']:.0f} | "
            f"{f['step8_replay_us']:.0f} | {f['step8_fused_replay_us']:.0f} | "
            f"{f['step8_eager_us'] / f['step8_fused_replay_us']:.2f}x |")
    ok = all(f.get("step8_ok", True) for f in pc.values())
    lines += ["", f"The step is one kernel and 8 AllReduces of 1 KiB (`benchmarks/graph_step.py`); "
              f"the replayed steps' results {'equal' if ok else 'DIFFER from'} the eager ones.",
              ""]
    return "\n".join(lines)


def write_section(name: str, title: str, command: str, head: list, rows: list,
                  text: str = "", docs: str = DOCS) -> str:
    """Save one benchmark's figures as ``docs/figures-NAME.json`` and re-render docs/figures.md.

    Benchmarks other than ``benchmarks.compare`` (per-call costs, the npu device, big worlds)
    each own one such section; the page shows them after compare's table, sorted by name.
    """
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=docs, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    section = {"title": title, "command": command, "commit": commit,
               "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
               "load": load, "head": [str(h) for h in head],
               "rows": [[str(c) for c in r] for r in rows], "text": text}
    path = os.path.join(docs, f"figures-{name}.json")
    with open(path, "w") as f:
        json.dump(section, f, indent=1)
        f.write("\n")
    with open(os.path.join(docs, "figures.json")) as f:
        run = json.load(f)
    with open(os.path.join(docs, "figures.md"), "w") as f:
        f.write(render(run, docs))
    return path


def sections(docs: str) -> str:
    """The other benchmarks' sections (``docs/figures-*.json``), as markdown."""
    out = []
    for path in sorted(glob.glob(os.path.join(docs, "figures-*.json"))):
        with open(path) as f:
            s = json.load(f)
        lines = ["", f"## {s['title']}", "",
                 f"`{s['command']}` (commit `{s['commit']}`, {s['utc']} UTC, load average "
                 f"{s['load']} at the end)", ""]
        if s.get("text"):
            lines += [s["text"].strip(), ""]
        if s.get("head"):
            lines += ["| " + " | ".join(s["head"]) + " |", "|" + "---|" * len(s["head"])]
            lines += ["| " + " | ".join(r) + " |" for r in s["rows"]]
        out.append("\n".join(lines) + "\n")
    return "".join(out)


def render(run: dict, docs: str = DOCS) -> str:
    m = run["machine"]
    call = "not measured" if m.get("empty_call_ns") is None else f"{m['empty_call_ns']:.0f} ns"
    peers = ", ".join(f"{k} {m[k]}" for k in ("torch", "mpi") if m.get(k)) or "none ran"
    notes = "".join(f"- {n}\n" for n in run["notes"]) or "- none\n"
    return f"""# Figures: npusim next to gloo and Open MPI

<!-- Generated by benchmarks/compare.py from docs/figures.json; rerun, do not edit. -->

Rerun from a fresh clone with one command (installs Open MPI, mpi4py and torch's CPU wheel where
missing: [benchmarks/peers/setup.sh](../benchmarks/peers/setup.sh)):

```bash
bash benchmarks/compare.sh
```

This page's run:

| | |
|---|---|
| command | `{run['command']}` |
| commit | `{run['commit']}` ({run['utc']} UTC) |
| machine | {m['cpu']}, {m['cores']} cores; load average {m['load_average']} at the end |
| interpreter speed | an empty Python call {call} (`python -m runtime.bench`; this VM drifts up to 2x) |
| software | Python {m['python']}, numpy {m['numpy']}; peers: {peers} |
| numpy add, 64 MiB, one core | {m['numpy_add_GBps']} GB/s (2 reads + 1 write) |
| npusim wrong elements | {run['wrong']} (every result checked, `hccl.bench -c 1`) |

Every system runs the same collectives on the same float32 sizes, one after the other in each of
{run['rounds']} interleaved rounds, with ~0.1 s of warm-up and then as many calls as fill
{run['target_s']:g} s per size: npusim's `hccl.bench` under npurun, torch.distributed's gloo
([benchmarks/peers/gloo_bench.py](../benchmarks/peers/gloo_bench.py)) and Open MPI through
mpi4py ([benchmarks/peers/mpi_bench.py](../benchmarks/peers/mpi_bench.py)). A call's time is the
slowest rank's, the figure the median over calls, and the table the median over rounds;
nccl-tests' conventions (size = the AllReduce / Broadcast buffer, the gathered AllGather output;
busbw = algbw x 2(n-1)/n for AllReduce, x (n-1)/n for AllGather, x 1 for Broadcast). Below 1 MiB
the cells are microseconds, from 1 MiB busbw in GB/s. The *ceiling* (`benchmarks/ceiling.py`) is
the copies and adds the collective cannot avoid, run in numpy in as many processes at once with
no communication: what memory allows on this machine. Ratios above 1 favour npusim. Ranks
beyond the core count share cores (world 4 on 2 cores is oversubscribed for every system).

{table(run)}
{percall(run)}
Notes from the run:

{notes}{sections(docs)}"""


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.figures RUN.json > PAGE.md", file=sys.stderr)
        return 2
    with open(args[0]) as f:
        sys.stdout.write(render(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
