"""Where the time went: the summary of a profiled job, from its per-rank traces.

``npurun --profile DIR`` prints it at the end of the job; ``python -m launcher.profsummary DIR``
prints it from a trace directory afterwards. Per rank: the step time and its split (compute,
collectives' transfer, waiting for a late peer, copies, host time; ``parts`` states
the rules), the memory peak; the slowest rank, by how much and in which operator; the top
operators by total time with calls, mean, p50, p99, max (torch.profiler's ``key_averages``
table); fluctuations (``fluctuation``). DIR also gets ``summary.json`` and
``op_summary.csv`` (one row per rank and operator); docs/profiling.md describes both.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from collections import Counter

import numpy as np

from launcher.profile import fluctuation, parts as profparts
from launcher.profile.parts import PARTS, RankTrace

SCHEMA_VERSION = 1
SUMMARY_JSON = "summary.json"
OP_CSV = "op_summary.csv"
SORT_KEYS = ("total", "calls", "mean", "p50", "p99", "max")
MAX_RANK_ROWS = 8           # ranks shown in the table (the slowest ones beyond that)
MAX_FLAG_LINES = 6
CAUSE_CPU = 0.05            # an operator named as the slowest rank's cause did this much more
#                             CPU work there than the others' median (where CPU time is recorded)
CSV_FIELDS = ("rank", "kind", "name", "calls", "total_us", "mean_us", "p50_us", "p99_us",
              "max_us", "min_us", "peer_wait_us", "cpu_mean_us", "site")


def _stats(v: np.ndarray) -> dict:
    if len(v) == 0:
        return {"calls": 0, "total_us": 0.0, "mean_us": 0.0, "p50_us": 0.0, "p99_us": 0.0,
                "max_us": 0.0, "min_us": 0.0}
    p50, p99 = np.percentile(v, [50, 99])
    return {"calls": int(len(v)), "total_us": float(v.sum()), "mean_us": float(v.mean()),
            "p50_us": float(p50), "p99_us": float(p99), "max_us": float(v.max()),
            "min_us": float(v.min())}


def _groups(rt: RankTrace, mask: np.ndarray) -> dict:
    """(kind, name) -> indices of ``rt``'s events selected by ``mask``."""
    out: dict = {}
    for i in np.flatnonzero(mask):
        out.setdefault((rt.kind[i], rt.name[i]), []).append(i)
    return {k: np.asarray(v) for k, v in out.items()}


def _op_calls(rt: RankTrace, upto: int) -> dict:
    """(kind, name) -> OpCalls of the rank's device calls in steps 1..upto."""
    ops = np.asarray([k is not None for k in rt.kind], bool)
    mask = ops & (rt.step >= 1) & (rt.step <= upto) if len(ops) else ops
    out = {}
    for (kind, name), idx in _groups(rt, mask).items():
        out[(kind, name)] = fluctuation.OpCalls(
            rt.rank, name, kind, (rt.t1[idx] - rt.t0[idx]) - rt.wait[idx], rt.cpu[idx],
            rt.step[idx], [rt.site[i] for i in idx], rt.t0[idx],
            rt.delay[idx] if rt.delay is not None else None)
    return out


def summarize(paths: list[str]) -> dict:
    """The summary document of the per-rank traces at ``paths`` (see docs/profiling.md).

    Raises ValueError when there is no path or a file is not a readable trace (named).
    """
    if not paths:
        raise ValueError("profsummary: no trace files given")
    traces = sorted((profparts.load(p) for p in paths), key=lambda t: t.rank)
    profparts.analyze(traces)
    stepped = [t for t in traces if t.steps > 0]
    common = min((t.steps for t in stepped), default=0)
    doc = {"version": SCHEMA_VERSION, "traces": [os.path.abspath(t.path) for t in traces],
           "steps": {"source": "marks" if all(t.marked for t in stepped) and stepped else "run",
                     "common": common},
           "ranks": [], "slowest": None, "operators": [], "per_rank_operators": [],
           "fluctuations": [], "rules": dict(fluctuation.RULES)}
    busy = {}
    for t in traces:
        st = np.diff(t.ends) if t.steps else np.zeros(0)
        parts = t.parts.mean(0) if t.steps else np.zeros(len(PARTS))
        alloc, reserved = profparts.peak_memory(t)
        c = min(common, t.steps)
        if c:
            busy[t.rank] = float((st[:c] - t.parts[:c, profparts.WAIT]).mean())
        doc["ranks"].append({
            "rank": t.rank, "steps": t.steps, "step_us": [float(x) for x in st],
            "step_mean_us": float(st.mean()) if len(st) else 0.0,
            "step_p50_us": float(np.median(st)) if len(st) else 0.0,
            "parts_us": {p: float(v) for p, v in zip(PARTS, parts)},
            "busy_us": float(st.mean() - parts[profparts.WAIT]) if len(st) else 0.0,
            "peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved})
    doc["operators"] = _table(traces)
    doc["per_rank_operators"] = _per_rank_table(traces)
    calls = {t.rank: _op_calls(t, common) for t in traces}
    doc["slowest"] = _slowest(traces, busy, calls, common)
    step_p50 = [r["step_p50_us"] for r in doc["ranks"] if r["steps"]]
    floor = fluctuation.floor_for(float(np.median(step_p50)) if step_p50 else 0.0)
    doc["rules"]["floor_us"] = floor
    doc["fluctuations"] = _fluctuations(calls, common, floor)
    return doc


def _table(traces: list[RankTrace]) -> list[dict]:
    """One row per (kind, name) over every rank's whole recording."""
    times: dict = {}
    for t in traces:
        ops = np.asarray([k is not None for k in t.kind], bool)
        for key, idx in _groups(t, ops).items():
            d, w = times.setdefault(key, ([], []))
            d.append(t.t1[idx] - t.t0[idx])
            w.append(t.wait[idx])
    rows = []
    for (kind, name), (d, w) in times.items():
        row = {"kind": kind, "name": name, **_stats(np.concatenate(d)),
               "peer_wait_us": float(np.concatenate(w).sum())}
        rows.append(row)
    rows.sort(key=lambda r: -r["total_us"])
    return rows


def _per_rank_table(traces: list[RankTrace]) -> list[dict]:
    rows = []
    for t in traces:
        ops = np.asarray([k is not None for k in t.kind], bool)
        for (kind, name), idx in sorted(_groups(t, ops).items()):
            cpu = t.cpu[idx]
            sites = [t.site[i] for i in idx if t.site[i]]
            rows.append({"rank": t.rank, "kind": kind, "name": name,
                         **_stats(t.t1[idx] - t.t0[idx]),
                         "peer_wait_us": float(t.wait[idx].sum()),
                         "cpu_mean_us": float(np.nanmean(cpu)) if (~np.isnan(cpu)).any()
                         else None,
                         "site": Counter(sites).most_common(1)[0][0] if sites else None})
    return rows


def _slowest(traces, busy: dict, calls: dict, common: int) -> dict | None:
    """The rank the others wait for (most busy time per step) and what makes it slower."""
    if len(busy) < 2 or common <= 0:
        return None
    rank = max(busy, key=busy.get)
    others = [v for r, v in busy.items() if r != rank]
    usual = float(np.median(others))
    # per-step time of each operator (and of the host) on every rank, over the common steps:
    # its device time (held its stream, less its worker's waits for a core) where the trace
    # has run delays, which alone names the operator; else its wall time, with its CPU time
    # (None: not recorded, or device time known) that must agree
    per: dict = {}
    for t in traces:
        if t.rank not in busy:
            continue
        for key, c in calls[t.rank].items():
            dev = fluctuation.device_time(c)
            cpu = float(c.cpu.sum()) / common if key[0] != "collective" and dev is c.time and \
                not np.isnan(c.cpu).any() else None
            per.setdefault(key, {})[t.rank] = (float(dev.sum()) / common, cpu)
        host = float(t.parts[:common, profparts.HOST].mean())
        waits = t.host_delays()
        if waits is not None and len(waits) >= common:    # less the host's waits for a core,
            host = max(host - float(waits[:common].mean()), 0.0)    # as operators' device time
        per.setdefault(("host", "host time between tasks"), {})[t.rank] = (host, None)
    cause, excess = None, 0.0
    for key, by_rank in per.items():
        mine = by_rank.get(rank, (0.0, None))
        rest = [by_rank.get(r, (0.0, None)) for r in busy if r != rank]
        d = mine[0] - float(np.median([w for w, _ in rest]))
        cpus = [c for _, c in rest]
        if mine[1] is not None and None not in cpus and \
                mine[1] < (1 + CAUSE_CPU) * float(np.median(cpus)):
            continue        # no more work there: its wall time grew with a busier core
        if d > excess:
            cause, excess = key, d
    return {"rank": rank, "busy_us": busy[rank], "others_median_us": usual,
            "excess_us": busy[rank] - usual,
            "excess_share": (busy[rank] - usual) / usual if usual > 0 else 0.0,
            "cause": None if cause is None else {"kind": cause[0], "name": cause[1],
                                                 "excess_us_per_step": excess}}


def _fluctuations(calls: dict, common: int, floor: float) -> list[dict]:
    flags = []
    for per_op in calls.values():
        ops = list(per_op.values())
        for c, f in zip(ops, fluctuation.local_factors(ops)):
            flags += fluctuation.slow_calls(c, floor, f)
    keys = {k for per_op in calls.values() for k in per_op}
    shared = [[calls[r][key] for r in sorted(calls)] for key in sorted(keys)
              if all(key in calls[r] for r in calls)]
    factors = fluctuation.rank_factors(shared)
    for ranks in shared:
        flags += fluctuation.slow_ranks(ranks, common, floor, factors)
    flags.sort(key=lambda f: -(f.time_us - f.usual_us) * (f.calls if f.what == "rank" else 1))
    return [{"what": f.what, "rank": f.rank, "kind": f.kind, "name": f.op, "step": f.step,
             "steps": list(f.steps), "site": f.site, "time_us": f.time_us,
             "usual_us": f.usual_us, "ratio": f.ratio, "calls": f.calls, "measure": f.measure}
            for f in flags]


# ---------------------------------------------------------------------- text
_ON = {"device": " on the device", "cpu": " of CPU"}    # what a flag's times are (Flag.measure)

def _t(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} us"


def _b(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} B"


def render(doc: dict, sort: str = "total", top: int = 10, where: str = "") -> list[str]:
    """The summary as console lines (about 20 + top + flags for up to 8 ranks)."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort={sort!r}: use one of {', '.join(SORT_KEYS)}")
    ranks = doc["ranks"]
    steps = doc["steps"]
    how = ("steps marked by runtime.profiler.step()" if steps["source"] == "marks"
           else "no step marks: the whole run is one step")
    lines = [f"profile summary{' of ' + where if where else ''}: {len(ranks)} rank(s), "
             f"{steps['common']} step(s) in common ({how})"]
    lines.append(f"  {'rank':>4} {'step':>9} {'compute':>8} {'transfer':>8} {'copy':>6} "
                 f"{'peer wait':>9} {'host':>6} {'peak alloc / reserved':>22}")
    shown = ranks
    if len(ranks) > MAX_RANK_ROWS:
        shown = sorted(ranks, key=lambda r: -r["busy_us"])[:MAX_RANK_ROWS]
        shown.sort(key=lambda r: r["rank"])
    for r in shown:
        st = r["step_mean_us"] or 1.0
        p = r["parts_us"]
        lines.append(
            f"  {r['rank']:>4} {_t(r['step_mean_us']):>9} {p['compute'] / st:>8.1%} "
            f"{p['transfer'] / st:>8.1%} {p['copy'] / st:>6.1%} {p['peer_wait'] / st:>9.1%} "
            f"{p['host'] / st:>6.1%} "
            f"{_b(r['peak_allocated_bytes']) + ' / ' + _b(r['peak_reserved_bytes']):>22}")
    if len(shown) < len(ranks):
        lines.append(f"  ({len(ranks) - len(shown)} faster rank(s) not shown: see summary.json)")
    s = doc["slowest"]
    if s:
        line = (f"slowest rank: {s['rank']}, busy {_t(s['busy_us'])} per step (step less peer "
                f"wait), {_t(s['excess_us'])} ({s['excess_share']:+.1%}) over the others' median")
        if s["cause"] and s["excess_us"] > 0:
            c = s["cause"]
            what = c["name"] if c["kind"] == "host" else f"{c['kind']} {c['name']}"
            line += f"; most in {what} (+{_t(c['excess_us_per_step'])}/step)"
        elif s["excess_us"] > 0:
            line += "; no operator did more work there (a busier core?)"
        lines.append(line)
    rows = sorted(doc["operators"], key=lambda r: -r[f"{sort}_us" if sort != "calls"
                                                       else "calls"])[:top]
    lines.append(f"top {len(rows)} operators by {sort} time, all ranks (calls, mean, p50, p99, "
                 "max; a collective's time includes its peer wait):")
    w = max([len(r["name"]) for r in rows] + [4])
    lines.append(f"  {'name':<{w}} {'kind':<10} {'calls':>6} {'total':>9} {'mean':>9} "
                 f"{'p50':>9} {'p99':>9} {'max':>9} {'peer wait':>9}")
    for r in rows:
        lines.append(f"  {r['name']:<{w}} {r['kind']:<10} {r['calls']:>6} "
                     f"{_t(r['total_us']):>9} {_t(r['mean_us']):>9} {_t(r['p50_us']):>9} "
                     f"{_t(r['p99_us']):>9} {_t(r['max_us']):>9} "
                     f"{_t(r['peer_wait_us']) if r['kind'] == 'collective' else '':>9}")
    flags = doc["fluctuations"]
    if not flags:
        lines.append("fluctuations: none (rules: docs/profiling.md)")
    else:
        lines.append(f"fluctuations: {len(flags)} (rules: docs/profiling.md)")
        for f in flags[:MAX_FLAG_LINES]:
            if f["what"] == "call":
                lines.append(f"  rank {f['rank']} step {f['step']}: {f['kind']} {f['name']} took "
                             f"{_t(f['time_us'])}{_ON.get(f.get('measure'), '')}, "
                             f"{f['ratio']:.1f}x its median "
                             f"{_t(f['usual_us'])}, at {f['site'] or '?'}")
            else:
                lines.append(f"  rank {f['rank']} steps {f['steps'][0]}-{f['steps'][1]}: "
                             f"{f['kind']} {f['name']} median "
                             f"{_t(f['time_us'])}{_ON.get(f.get('measure'), '')}, "
                             f"{f['ratio']:.2f}x the other ranks' {_t(f['usual_us'])}, at "
                             f"{f['site'] or '?'}")
        if len(flags) > MAX_FLAG_LINES:
            lines.append(f"  ... {len(flags) - MAX_FLAG_LINES} more in summary.json")
    return lines


# ---------------------------------------------------------------------- files
def write(doc: dict, directory: str) -> tuple[str, str]:
    """Write ``summary.json`` and ``op_summary.csv`` into ``directory``; returns their paths."""
    js, cs = os.path.join(directory, SUMMARY_JSON), os.path.join(directory, OP_CSV)
    for path, fill in ((js, lambda f: json.dump(doc, f, indent=1)), (cs, _csv(doc))):
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", newline="") as f:
            fill(f)
        os.replace(tmp, path)
    return js, cs


def _csv(doc: dict):
    def fill(f):
        w = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in doc["per_rank_operators"]:
            w.writerow({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    return fill


def summarize_dir(directory: str, paths: list[str] | None = None, *, sort: str = "total",
                  top: int = 10) -> list[str]:
    """Summarize the rank traces of ``directory`` (or ``paths``), write the JSON and CSV files
    there and return the console lines. Raises FileNotFoundError / ValueError (named)."""
    from launcher.profile.tracemerge import rank_traces
    paths = paths if paths is not None else rank_traces(directory)
    if not paths:
        raise FileNotFoundError(f"no trace_rank<N>.json files in {directory}")
    doc = summarize(paths)
    js, cs = write(doc, directory)
    return [line.rstrip() for line in render(doc, sort, top)] + [f"wrote {js} and {cs}"]


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m launcher.profsummary",
                                description="Where the time went in a profiled npusim job.")
    p.add_argument("directory", help="a directory of trace_rank<N>.json files "
                                     "(npurun --profile DIR)")
    p.add_argument("--sort", default="total", choices=SORT_KEYS,
                   help="order of the operator table (default total)")
    p.add_argument("--top", type=int, default=10, help="operators shown (default 10)")
    args = p.parse_args(argv)
    if args.top < 1:
        p.error(f"--top {args.top} must be >= 1")
    try:
        lines = summarize_dir(args.directory, sort=args.sort, top=args.top)
    except (OSError, ValueError) as e:
        print(f"profsummary: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
