"""Merge the per-rank Chrome traces of a job into one trace: a process per rank, a track per stream.

Each rank writes its own trace (``runtime.profile`` or ``NPUSIM_PROFILE_DIR``): pid = rank,
tid = stream, "X" events stamped in wall-clock microseconds, so traces of the ranks of one node
line up as they are. Merging keeps every event and timestamp unchanged and only makes the
processes unambiguous: each input becomes the process of its rank (from its ``process_name``
metadata "rank N", else the ``trace_rank<N>`` file name, else its only pid), named "rank N" and
sorted by rank; an input whose rank is unknown or already taken (two traces of one rank) gets a
fresh pid above every rank, so no two inputs' tracks are ever mixed. Each input is taken as one
process (as the runtime writes them): all its events go to that process.

Pure functions, no launcher state: ``merge(paths, out_path)`` and ``merge_dir(dir)``; also
``python -m launcher.tracemerge DIR [-o OUT]``.
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

MERGED_NAME = "trace_merged.json"
_RANK_FILE = re.compile(r"trace_rank(\d+)\.json$")
_RANK_LABEL = re.compile(r"rank (\d+)$")


def read_trace(path: str) -> tuple[dict | list, list[dict]]:
    """One Chrome trace file: (the document, its event list), the document an object with
    traceEvents or a bare list. Raises ValueError naming the file when it cannot be read or is
    not a Chrome trace."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read trace {path}: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError(f"{path} is not a Chrome trace: expected a list of events or an object "
                         "with a 'traceEvents' list")
    return doc, events


def labelled_rank(path: str, events: list[dict]) -> int | None:
    """The rank that wrote ``events`` by its process_name label ("rank N"), else by the file
    name (trace_rank<N>.json); None when neither says."""
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            m = _RANK_LABEL.match(str((e.get("args") or {}).get("name", "")))
            if m:
                return int(m.group(1))
    m = _RANK_FILE.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def _rank_of(path: str, events: list[dict]) -> int | None:
    """The rank that wrote ``events``: ``labelled_rank``, else its one pid."""
    rank = labelled_rank(path, events)
    if rank is not None:
        return rank
    pids = {e.get("pid") for e in events if "pid" in e}
    if len(pids) == 1:
        pid = pids.pop()
        if isinstance(pid, int) and pid >= 0:
            return pid
    return None


def merge(paths: list[str], out_path: str) -> dict:
    """Merge the Chrome traces at ``paths`` into ``out_path``; returns the merged trace.

    Raises:
        ValueError: no paths, or a file that is not a readable Chrome trace (named).
    """
    if not paths:
        raise ValueError("merge: no trace files given")
    loaded = [(p, read_trace(p)[1]) for p in paths]
    ranks = [_rank_of(p, ev) for p, ev in loaded]
    taken: set[int] = set()
    pid_for: list[int] = []
    spare = max([r for r in ranks if r is not None], default=-1) + 1
    for r in ranks:                      # a rank keeps its own number; duplicates get spare pids
        if r is None or r in taken:
            r, spare = spare, spare + 1
        taken.add(r)
        pid_for.append(r)

    meta: list[dict] = []
    spans: list[dict] = []
    for (path, events), rank, pid in zip(loaded, ranks, pid_for):
        name = os.path.basename(path)
        label = f"rank {pid}" if rank == pid else name if rank is None else f"rank {rank} ({name})"
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": label}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
        for e in events:
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index"):
                continue            # replaced by the lines above
            e = dict(e)
            e["pid"] = pid
            (meta if e.get("ph") == "M" else spans).append(e)
    spans.sort(key=lambda e: (e.get("ts", 0), e["pid"], e.get("tid", 0)))
    merged = {"traceEvents": meta + spans, "displayTimeUnit": "ms",
              "otherData": {"merged_from": [os.path.abspath(p) for p in paths]}}
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{out_path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(merged, f)
    os.replace(tmp, out_path)
    return merged


def rank_traces(directory: str) -> list[str]:
    """The ``trace_rank<N>.json`` files of ``directory``, in rank order."""
    found = [p for p in glob.glob(os.path.join(glob.escape(directory), "trace_rank*.json"))
             if _RANK_FILE.search(os.path.basename(p))]
    return sorted(found, key=lambda p: int(_RANK_FILE.search(os.path.basename(p)).group(1)))


def merge_dir(directory: str) -> str:
    """Merge every ``trace_rank*.json`` of ``directory`` into ``directory/trace_merged.json``.

    Returns the merged file's path. Raises FileNotFoundError when there is no rank trace there.
    """
    paths = rank_traces(directory)
    if not paths:
        raise FileNotFoundError(f"no trace_rank<N>.json files in {directory} to merge")
    out = os.path.join(directory, MERGED_NAME)
    merge(paths, out)
    return out


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m launcher.tracemerge",
                                description="Merge per-rank npusim traces into one Chrome trace.")
    p.add_argument("inputs", nargs="+",
                   help="a directory of trace_rank<N>.json files, or trace files")
    p.add_argument("-o", "--output", help=f"merged trace (default DIR/{MERGED_NAME})")
    args = p.parse_args(argv)
    if len(args.inputs) == 1 and os.path.isdir(args.inputs[0]):
        paths = rank_traces(args.inputs[0])
        out = args.output or os.path.join(args.inputs[0], MERGED_NAME)
    else:
        paths = args.inputs
        out = args.output or MERGED_NAME
    try:
        if not paths:
            raise FileNotFoundError(f"no trace_rank<N>.json files in {args.inputs[0]}")
        merged = merge(paths, out)
    except (OSError, ValueError) as e:
        print(f"tracemerge: {e}", file=sys.stderr)
        return 1
    n = sum(1 for e in merged["traceEvents"] if e.get("ph") != "M")
    print(f"merged {len(paths)} traces ({n} events) into {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
