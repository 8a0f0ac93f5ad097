"""The text of npurun's job verdict: the report it prints, and the Python stacks in it made
readable (npusim's own frames folded, idle daemon threads dropped, threads named).

``launcher.verdict`` decides (a pure classifier); this module only words its result.
"""
from __future__ import annotations

import os
import time

_STACK_LINES = 24
GROUP_ROWS = 16     # a verdict table of more ranks shows one row per distinct state (ranges)


def name_threads(stack: str | None, names: dict | None) -> str | None:
    """Add each thread's name (from the rank's published state) to faulthandler's dump."""
    if not stack or not names:
        return stack
    out = []
    for line in stack.splitlines():
        for prefix in ("Thread ", "Current thread "):
            if line.startswith(prefix):
                tid = line[len(prefix):].split(" ", 1)[0]
                if tid in names:
                    line = line.replace(tid, f"{tid} [{names[tid]}]", 1)
        out.append(line)
    return "\n".join(out)


_INTERNAL_THREADS = ("hccl/diag.py", "hccl/transport/zmq.py", "hccl/store.py")
_BOOTSTRAP = ("launcher/worker.py", "<frozen runpy>")
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN = tuple(f'File "{os.path.join(_PKG, p)}{os.sep}' for p in ("runtime", "hccl", "launcher")) \
    + ("threading.py\"",)


def _own_frame(line: str) -> bool:
    """A frame of npusim itself or of the threading module (the user did not write it)."""
    return line.strip().startswith("File ") and any(t in line for t in _OWN)


def _collapse(block: str) -> list[str]:
    """A thread's frames with runs of npusim's own frames folded into one line."""
    out, run = [], 0
    for line in block.splitlines():
        if any(t in line for t in _BOOTSTRAP):
            continue
        if _own_frame(line):
            run += 1
            continue
        if run:
            out.append(f"  ... {run} frame(s) of npusim")
            run = 0
        out.append(line)
    if run:
        out.append(f"  ... {run} frame(s) of npusim")
    return out


def _busy(block: str) -> bool:
    """A thread worth showing: it runs user code, or a stream task (not an idle stream worker)."""
    frames = [l for l in block.splitlines() if l.strip().startswith("File ")]
    return any(not _own_frame(l) and not any(t in l for t in _BOOTSTRAP) for l in frames) or \
        any("runtime/stream.py" in l and l.rstrip().endswith(" in _run") for l in frames)


def user_threads_first(stack: str) -> str:
    """faulthandler's dump for a reader: the main thread first, the other threads only when busy
    (npusim's daemon threads and idle stream workers say nothing about the hang), npusim's own
    frames folded (the full dump is in hang_report.json)."""
    blocks = [b for b in stack.strip().split("\n\n") if b.strip()]
    main = [b for b in blocks if b.lstrip().startswith("Current thread")]
    rest = [b for b in blocks if b not in main and not any(t in b for t in _INTERNAL_THREADS)
            and _busy(b)]
    return "\n\n".join("\n".join(_collapse(b)) for b in main + rest)


def last_traceback(tb: str | None) -> str | None:
    """The outermost exception of a chained traceback (where the user's code saw it), with
    npusim's own frames folded."""
    if not tb:
        return None
    part = tb.strip().split("Traceback (most recent call last):")[-1]
    out, run, skipping = ["Traceback (most recent call last):"], 0, False
    for line in part.splitlines():
        if not line.strip() or set(line.strip()) <= set("^~"):
            continue
        if line.startswith("  File "):
            skipping = _own_frame(line) or any(t in line for t in _BOOTSTRAP)
            if skipping:
                run += 1
                continue
        elif skipping and line.startswith("    "):
            continue                    # the source line of a skipped frame
        else:
            skipping = False
        if run:
            out.append(f"  ... {run} frame(s) of npusim")
            run = 0
        out.append(line)
    return "\n".join(out)


def format_report(v: dict, *, now: float | None = None, stacks: bool = True) -> str:
    """The one report npurun prints: culprits first, then the table, then the culprits' stacks."""
    now = time.time() if now is None else now
    bar = "=" * 78
    lines = [bar, "npusim job verdict" + (f": {v['reason']}" if v.get("reason") else ""), bar]
    if v.get("cycle"):
        lines.append("wait-for cycle: " + " -> ".join(
            [f"rank {e['rank']} ({e['comm']} seq {e['seq']})" for e in v["cycle"]]
            + [f"rank {v['cycle'][0]['rank']}"]))
    elif v.get("comm") is not None:
        lines.append(f"communicator {v['comm']} (ranks {v['members']}), seq {v['seq']}: {v['op']}")
    lines.append(f"culprit rank(s): {v['culprits'] if v['culprits'] else 'none found'}")
    lines.append(f"verdict: {v['verdict']}")
    lines.append("")
    lines.append(f"{'rank':>5}  {'state':<12} {'seq':>5}  {'op':<40} {'waiting for':<12} {'since':>8}")
    for ranks, e in _rows(v["ranks"]):
        since = f"{now - e['since']:.1f} s" if e.get("since") else "-"
        wf = f"rank {e['waiting_for']}" if e.get("waiting_for") is not None else "-"
        op = e.get("op") or "-"
        lines.append(f"{ranks:>5}  {e['state']:<12} "
                     f"{e['seq'] if e['seq'] is not None else '-':>5}  "
                     f"{op[:40]:<40} {wf:<12} {since:>8}")
        if e.get("detail") and (e["state"] != "waiting" or v.get("cycle")):
            lines.append(f"{'':>7}{e['detail']}")
    where = f"not a member of {v['comm']}" if not v.get("cycle") else "not in the cycle"
    for ranks, e in _rows(v.get("other_ranks") or {}, lambda e: e["state"]):
        lines.append(f"{ranks:>5}  ({where}: {e['state']})")
    if stacks:
        for c in v["culprits"]:
            e = v["ranks"].get(str(c)) or {}
            # a rank that raised shows where its code saw the error; a stack taken while it
            # was exiting shows nothing of it
            st, what = e.get("stack"), "Python stacks"
            if e.get("traceback"):
                st, what = last_traceback(e["traceback"]), "traceback"
            elif st:
                st = user_threads_first(st)
            if st:
                body = st.strip().splitlines()
                more = len(body) - _STACK_LINES
                lines.append(f"----- {what} of culprit rank {c} -----")
                lines.extend(body[:_STACK_LINES])
                if more > 0:
                    lines.append(f"... ({more} more lines in hang_report.json)")
    lines.append(bar)
    return "\n".join(lines)


def _same_row(e: dict):
    """What makes two ranks' rows of the verdict table say the same (not their ``since``)."""
    shown = e.get("detail") if e.get("state") != "waiting" else None
    return (e.get("state"), e.get("seq"), e.get("op"), e.get("waiting_for"), shown)


def _rows(entries: dict, key=_same_row) -> list[tuple[str, dict]]:
    """The table's rows: one per rank; above GROUP_ROWS ranks, one per distinct row (the
    ranks as ranges, the oldest ``since``), in the order of their first rank."""
    items = sorted(entries.items(), key=lambda kv: int(kv[0]))
    if len(items) <= GROUP_ROWS:
        return [(r, e) for r, e in items]
    groups: dict = {}
    for r, e in items:
        groups.setdefault(key(e), []).append((int(r), e))
    out = []
    for members in groups.values():
        e = dict(members[0][1])
        sinces = [m.get("since") for _, m in members if m.get("since")]
        if sinces:
            e["since"] = min(sinces)
        out.append((ranks_text([r for r, _ in members]).split(" ", 1)[1], e))
    return out


def ranks_text(ranks) -> str:
    """``rank 2`` / ``ranks 0, 1, 3`` / ``ranks 1-3`` (runs of three or more as ranges)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts += [f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else [str(r) for r in ranks[i:j + 1]]
        i = j + 1
    return "ranks " + ", ".join(parts)


def format_notice(stall: dict, v: dict, culprits: list, stacks: dict, *, now: float,
                  reminder: bool = False, settings: str = "") -> str:
    """The early verdict of a stall, as a notice: the rank the others wait for first, its state
    and its Python stack; then who waits. The job goes on, so nothing here says it failed."""
    waited = now - stall["since"]
    who = ranks_text(culprits) if culprits else "no rank"
    where = f"seq {stall['seq']} of {stall['comm']} ({stall['op']})"
    if stall["op"].startswith("RECV"):
        head = (f"{who} {'has' if len(culprits) == 1 else 'have'} not sent what "
                f"{ranks_text(stall['waiters'])} {'waits' if len(stall['waiters']) == 1 else 'wait'}"
                f" to receive in {where} for {waited:.0f} s")
    else:
        head = (f"{who} {'has' if len(culprits) == 1 else 'have'} not called {where} for "
                f"{waited:.0f} s; {ranks_text(stall['waiters'])} "
                f"{'waits' if len(stall['waiters']) == 1 else 'wait'} for "
                f"{'it' if len(culprits) == 1 else 'them'}")
    lines = [f"npurun: {'reminder' if reminder else 'notice'}: {head} ({settings}; the job "
             "goes on: a rank doing long work of its own is fine)"]
    for c in culprits:
        e = (v.get("ranks") or {}).get(str(c))
        if e is not None:
            lines.append(f"  rank {c}: {e['state']}: {e['detail'] or e['op'] or ''}".rstrip())
        st = stacks.get(c)
        if st:
            body = user_threads_first(st).strip().splitlines()
            lines.append(f"----- Python stacks of rank {c} (now) -----")
            lines.extend(body[:_STACK_LINES])
            if len(body) > _STACK_LINES:
                lines.append(f"... ({len(body) - _STACK_LINES} more lines: npurun --status)")
    return "\n".join(lines)
