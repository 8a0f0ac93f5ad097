"""The text of npurun's job verdict: the report it prints, and the Python stacks in it made
readable (npusim's own frames folded, idle daemon threads dropped, threads named).

``launcher.diagnosis.verdict`` decides (a pure classifier); this module only words its result.
"""
from __future__ import annotations

import os
import time

_STACK_LINES = 24
GROUP_ROWS = 16     # a verdict table of more ranks shows one row per distinct state (ranges)
# A verdict of more than GROUP_ROWS ranks: its line budget, whatever the world size. With the
# failure summary after it (``launcher.diagnosis.summary``, at most ~20 lines) it fits on a screen.
BIG_LINES = 36          # the whole report
TABLE_LINES = 12        # the table's rows and their detail lines, the fold line included
OTHER_ROWS = 3          # rows of the ranks outside the communicator (by how they ended)
BIG_STACK_MIN = 6       # the first culprit's stack gets at least this many lines
CULPRITS_LISTED = 8     # more culprits than this are listed as ranges
DETAIL_CHARS = 200      # a grouped row's example detail is cut at a word
VERDICT_CHARS = 400
NOTICE_CULPRITS = 3     # a notice names this many held ranks (each with its stack, up to 3)
HELD_LISTED = 3         # the other collectives a culprit holds up, listed on its line


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
_PKG = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
    """The one report npurun prints: culprits first, then the table, then the culprits' stacks.

    A verdict of more than GROUP_ROWS ranks gets at most BIG_LINES lines whatever the world
    size (see ``_big_rows``): one row per distinct state, the ranks as ranges, the first
    culprit's stack once; everything per rank is in hang_report.json.
    """
    now = time.time() if now is None else now
    bar = "=" * 78
    big = len(v["ranks"]) + len(v.get("other_ranks") or {}) > GROUP_ROWS
    lines = [bar, "npusim job verdict" + (f": {v['reason']}" if v.get("reason") else ""), bar]
    if v.get("cycle"):
        lines.append("wait-for cycle: " + " -> ".join(
            [f"rank {e['rank']} ({e['comm']} seq {e['seq']})" for e in v["cycle"]]
            + [f"rank {v['cycle'][0]['rank']}"]))
    elif v.get("comm") is not None:
        members = v["members"]
        shown = ranks_text(members) if len(members) > GROUP_ROWS else f"ranks {members}"
        lines.append(f"communicator {v['comm']} ({shown}), seq {v['seq']}: {v['op']}")
    culprits = v["culprits"]
    named = culprits if culprits else "none found"
    if len(culprits) > CULPRITS_LISTED:
        named = short_ranks(culprits)
        named += "" if named.endswith(" ranks)") else f" ({len(culprits)} ranks)"
    lines.append(f"culprit rank(s): {named}")
    lines.append(f"verdict: {_cut(v['verdict'], VERDICT_CHARS) if big else v['verdict']}")
    for c, held in list((v.get("holds_up") or {}).items())[:1 if big else None]:
        where = "; ".join(f"{h['comm']} seq {h['seq']} ({h['op']}: "
                          f"{ranks_text(h['waiters'])} waiting)" for h in held[:HELD_LISTED])
        more = f"; {len(held) - HELD_LISTED} more" if len(held) > HELD_LISTED else ""
        lines.append(_cut(f"rank {c} also holds up: {where}{more}", 600 if big else 10 ** 6))
    lines.append("")
    lines.append(f"{'rank':>5}  {'state':<12} {'seq':>5}  {'op':<40} {'waiting for':<12} {'since':>8}")
    if big:
        lines += _big_table(v, now)
    else:
        for ranks, e in _rows(v["ranks"]):
            lines += _row(ranks, e, now, v)
        where = f"not a member of {v['comm']}" if not v.get("cycle") else "not in the cycle"
        for ranks, e in _rows(v.get("other_ranks") or {}, lambda e: e["state"]):
            lines.append(f"{ranks:>5}  ({where}: {e['state']})")
    if stacks:
        shown_stacks = 0
        for c in culprits:
            e = v["ranks"].get(str(c)) or {}
            # a rank that raised shows where its code saw the error; a stack taken while it
            # was exiting shows nothing of it
            st, what = e.get("stack"), "Python stacks"
            if e.get("traceback"):
                st, what = last_traceback(e["traceback"]), "traceback"
            elif st:
                st = user_threads_first(st)
            if not st:
                continue
            room = _STACK_LINES
            if big:         # the first culprit's stack, in what the budget leaves of it
                if shown_stacks:
                    lines.append(f"(the stacks of the other culprits: {v.get('report_path') or 'hang_report.json'})")
                    break
                # its header, a "more lines" line, the other culprits' line, the closing bar
                room = max(BIG_STACK_MIN, min(_STACK_LINES, BIG_LINES - len(lines) - 4))
            body = st.strip().splitlines()
            more = len(body) - room
            lines.append(f"----- {what} of culprit rank {c} -----")
            lines.extend(body[:room])
            if more > 0:
                lines.append(f"... ({more} more lines in hang_report.json)")
            shown_stacks += 1
    lines.append(bar)
    return "\n".join(lines)


def _row(ranks: str, e: dict, now: float, v: dict, detail: str | None = None,
         waiting: str | None = None) -> list[str]:
    """A row of the verdict table, and the line of its detail when it has one to show."""
    since = f"{now - e['since']:.1f} s" if e.get("since") else "-"
    wf = waiting or (f"rank {e['waiting_for']}" if e.get("waiting_for") is not None else "-")
    op = e.get("op") or "-"
    out = [f"{ranks:>5}  {e['state']:<12} "
           f"{e['seq'] if e['seq'] is not None else '-':>5}  "
           f"{op[:40]:<40} {wf:<12} {since:>8}"]
    detail = detail if detail is not None else e.get("detail")
    if detail and (e["state"] != "waiting" or v.get("cycle")):
        out.append(f"{'':>7}{detail}")
    return out


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


def _kind(e: dict, culprit: bool, cycle: bool) -> tuple:
    """What puts two ranks in one row of a big table: culprits apart from the rest, then the
    state, the call and how the rank ended (its exit, its error's type), not who it waits
    for nor the words of its detail (rank numbers and communicators differ from rank to
    rank)."""
    if e.get("state") == "waiting" and not cycle:
        return (not culprit, e.get("state"), e.get("seq"), e.get("op"))
    cls = (e.get("error") or "").split(":", 1)[0]
    first = (e.get("detail") or "").split(";", 1)[-1].strip().split(",", 1)[0].split(" (", 1)[0]
    return (not culprit, e.get("state"), e.get("seq"), e.get("op"), e.get("exit"), cls,
            first if culprit else "")


def _big_table(v: dict, now: float) -> list[str]:
    """The table of a big verdict in at most TABLE_LINES lines (see ``_kind``): culprits' rows
    first kept, then the biggest groups; the rest folded into one line."""
    culprits = set(v["culprits"])
    cycle = bool(v.get("cycle"))
    out = []
    if len(v["ranks"]) <= GROUP_ROWS:     # a small communicator of a big job: a row per rank
        out = [l for r, e in _rows(v["ranks"]) for l in _row(r, e, now, v)]
    if not out or len(out) > TABLE_LINES:
        out = _grouped(v, now, culprits, cycle)
    return out + _others(v, cycle)


def _grouped(v: dict, now: float, culprits: set, cycle: bool) -> list[str]:
    """The communicator's rows grouped by ``_kind``; the rows kept are the culprits' first,
    then the biggest, up to TABLE_LINES; the rest is folded into one line."""
    groups: dict = {}
    for r, e in sorted(v["ranks"].items(), key=lambda kv: int(kv[0])):
        groups.setdefault(_kind(e, int(r) in culprits, cycle), []).append((int(r), e))
    rows = []
    for kind, members in groups.items():
        ranks = [r for r, _ in members]
        e = dict(members[0][1])
        sinces = [m.get("since") for _, m in members if m.get("since")]
        e["since"] = min(sinces) if sinces else None
        waits = sorted({m["waiting_for"] for _, m in members if m.get("waiting_for") is not None})
        waiting = None
        if len(waits) > 1:
            waiting = ranks_text(waits)
            waiting = waiting if len(waiting) <= 12 else f"{len(waits)} ranks"
        details = {m.get("detail") for _, m in members}
        detail = e.get("detail")
        if detail and len(details) > 1:
            detail = f"e.g. rank {ranks[0]}: {detail}"
        detail = _cut(detail, DETAIL_CHARS) if detail else detail
        text = _row(short_ranks(ranks, 40), e, now, v, detail or "", waiting)
        rows.append((ranks[0], not kind[0], len(ranks), ranks, text))
    keep, used = [], 1          # one line kept for the fold
    for row in sorted(rows, key=lambda x: (not x[1], -x[2], x[0])):
        if used + len(row[4]) <= TABLE_LINES or (row[1] and not keep):
            keep.append(row)
            used += len(row[4])
    out = [l for row in sorted(keep, key=lambda x: x[0]) for l in row[4]]
    rest = sorted(r for row in rows if row not in keep for r in row[3])
    if rest:
        out.append(f"  ... {len(rows) - len(keep)} more row(s), {len(rest)} rank(s): "
                   f"{short_ranks(rest)} (every rank in hang_report.json)")
    return out


def _others(v: dict, cycle: bool) -> list[str]:
    """The ranks outside the communicator, one row per way they ended, at most OTHER_ROWS
    rows and a fold."""
    out, others = [], v.get("other_ranks") or {}
    if others:
        where = f"not a member of {v['comm']}" if not cycle else "not in the cycle"
        byst: dict = {}
        for r, e in sorted(others.items(), key=lambda kv: int(kv[0])):
            byst.setdefault(e["state"], []).append(int(r))
        shown = sorted(byst.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
        extra = shown[OTHER_ROWS:]
        for state, rs in sorted(shown[:OTHER_ROWS], key=lambda kv: kv[1][0]):
            out.append(f"{short_ranks(rs, 40):>5}  ({where}: {state})")
        if extra:
            rs = sorted(r for _, x in extra for r in x)
            out.append(f"  ... {short_ranks(rs)} ({where}: {len(extra)} other way(s) of ending)")
    return out


def _cut(text: str, limit: int) -> str:
    """``text`` shortened at a word to ``limit`` characters."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 4]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + " ..."


def short_ranks(ranks, limit: int = 60) -> str:
    """``0-36, 38-127`` (``ranks_text`` without its word), cut at a comma past ``limit``
    characters with the count of ranks left out."""
    ranks = sorted(ranks)
    text = ranks_text(ranks).split(" ", 1)[1]
    if len(text) <= limit:
        return text
    head = text[:limit].rsplit(",", 1)[0]
    return f"{head}, ... ({len(ranks)} ranks)"


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
    for i, c in enumerate(culprits[:NOTICE_CULPRITS]):
        e = (v.get("ranks") or {}).get(str(c))
        if e is not None:
            lines.append(f"  rank {c}: {e['state']}: {e['detail'] or e['op'] or ''}".rstrip())
        st = stacks.get(c)
        if st and (i == 0 or len(culprits) <= NOTICE_CULPRITS):
            body = user_threads_first(st).strip().splitlines()
            lines.append(f"----- Python stacks of rank {c} (now) -----")
            lines.extend(body[:_STACK_LINES])
            if len(body) > _STACK_LINES:
                lines.append(f"... ({len(body) - _STACK_LINES} more lines: npurun --status)")
    if len(culprits) > NOTICE_CULPRITS:     # many ranks held: the first ones, the first's stack
        lines.append(f"  ... and {len(culprits) - NOTICE_CULPRITS} more: ranks "
                     f"{short_ranks(culprits[NOTICE_CULPRITS:])} (npurun --status shows them)")
    return "\n".join(lines)
