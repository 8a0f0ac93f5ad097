"""A torch DDP peer killed mid-backward under ``npurun --max-restarts 1``: count what must hold.

One run: ``npurun --nproc-per-node 3 --max-restarts 1 peerkill_job.py``; in attempt 0 rank 1
SIGKILLs itself inside ``loss.backward()`` while DDP's gradient all_reduces are in flight.
Counted per run (docs/torch.md, "Errors, hangs and desyncs"):

- ``segv``: a rank died of SIGSEGV (or any fatal signal report: "Fatal Python error");
- ``last_line``: each surviving rank's last console line of attempt 0 names the dead rank;
- ``culprits``: the verdict's culprit list (``hang_report.json``) is exactly [1];
- ``restart``: npurun exits 0 after attempt 1 ran to the end;
- ``files``: every file the console points to exists (each rank's ``full traceback: PATH``,
  the summary's ``Full tracebacks:`` files, the hang report);
- ``position``: the dead rank's position does not contradict the survivors' (its seq is the
  verdict's seq, or it says it is unknown);
- ``attempts``: the attempts table's line of attempt 0 holds the verdict's whole line.

    python -m tests.faults.peerkill_torch --runs 20

prints one line per run and the totals; exit 1 if any run missed one.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field

from tests.leakcheck import LeakCheck, run_npurun

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peerkill_job.py")
KILLED = 1
SURVIVORS = (0, 2)
CHECKS = ("segv", "last_line", "culprits", "restart", "files", "position", "attempts")
_RANK_LINE = re.compile(r"^\[rank (\d+)\]: (.*)$")
_FATAL = ("Segmentation fault", "SIGSEGV", "Fatal Python error")


@dataclass
class Outcome:
    """One run: ``ok[check]`` for each of CHECKS, and why a check failed."""

    returncode: int
    seconds: float
    ok: dict = field(default_factory=dict)
    why: dict = field(default_factory=dict)
    culprits: list | None = None
    output: str = ""

    def line(self) -> str:
        bad = [f"{c}: {self.why.get(c, '')}" for c in CHECKS if not self.ok.get(c)]
        return (f"exit {self.returncode}, {self.seconds:.1f} s, culprits {self.culprits}: "
                + ("all checks hold" if not bad else "; ".join(bad)))


def _survivor_lines(attempt0: str) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for line in attempt0.splitlines():
        m = _RANK_LINE.match(line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return lines


def judge(returncode: int, output: str, report: dict | None, seconds: float = 0.0) -> Outcome:
    """The checks of one run from npurun's exit code, its console and its hang report."""
    o = Outcome(returncode, seconds, output=output)
    cut = output.find("npurun: restarting the job")
    attempt0 = output if cut < 0 else output[:cut]

    fatal = [t for t in _FATAL if t in output]
    o.ok["segv"] = not fatal
    o.why["segv"] = f"{fatal} in the output"

    lines = _survivor_lines(attempt0)
    bad = {r: (lines.get(r) or ["<no line>"])[-1][:160] for r in SURVIVORS
           if not lines.get(r) or f"rank {KILLED} " not in lines[r][-1]}
    o.ok["last_line"] = not bad
    o.why["last_line"] = f"last lines {bad}"

    o.culprits = None if report is None else report.get("culprits")
    o.ok["culprits"] = o.culprits == [KILLED]
    o.why["culprits"] = "no hang_report.json" if report is None else report.get("verdict", "")[:200]

    o.ok["restart"] = returncode == 0 and "peerkill job done (attempt 1" in output
    o.why["restart"] = f"exit {returncode}"

    pointed = re.findall(r"\(full traceback: ([^)\s]+)\)", output)
    pointed += re.findall(r"hang report written to (\S+)", output)
    for pattern, ranks in re.findall(r"Full tracebacks: (\S+) \(local ranks? ([\d, ]+)\)", output):
        pointed += [pattern.replace("<local_rank>", r.strip()) for r in ranks.split(",")]
    missing = [p for p in pointed if not os.path.isfile(p)]
    o.ok["files"] = bool(pointed) and not missing and "<local_rank>/traceback.log\n" not in output
    o.why["files"] = f"missing {missing}" if missing else "a pattern without its ranks"

    entry = ((report or {}).get("ranks") or {}).get(str(KILLED)) or {}
    detail = entry.get("detail") or ""
    o.ok["position"] = entry.get("state") == "dead" and (
        "unknown" in detail or entry.get("seq") in (None, report.get("seq")))
    o.why["position"] = f"{entry.get('state')} seq {entry.get('seq')}: {detail[:160]}"

    table = output[output.find("npurun: attempts of this job"):]
    first = next((l for l in table.splitlines() if l.strip().startswith("attempt 0:")), "")
    verdict = (report or {}).get("verdict") or "\0"
    o.ok["attempts"] = verdict in first
    o.why["attempts"] = first[:200]
    return o


def run_once(workdir: str, timeout: float = 240.0) -> Outcome:
    """One run in ``workdir`` (its log dir is ``workdir/logs``); nothing may leak."""
    logs = os.path.join(workdir, "logs")
    with LeakCheck() as lc:
        t0 = time.monotonic()
        res = run_npurun("--nproc-per-node", "3", "--max-restarts", "1", "--log-dir", logs, JOB,
                         env=lc.env, cwd=workdir, timeout=timeout)
        seconds = time.monotonic() - t0
    path = os.path.join(logs, "hang_report.json")
    report = None
    if os.path.isfile(path):
        with open(path) as f:
            report = json.load(f)
    return judge(res.returncode, res.stdout + res.stderr, report, seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--keep", help="keep each run's logs under this directory")
    args = p.parse_args(argv)
    totals = dict.fromkeys(CHECKS, 0)
    root = args.keep or tempfile.mkdtemp(prefix="peerkill-")
    for i in range(args.runs):
        work = os.path.join(root, f"run{i}")
        os.makedirs(work, exist_ok=True)
        o = run_once(work)
        for c in CHECKS:
            totals[c] += bool(o.ok.get(c))
        print(f"run {i + 1}/{args.runs}: {o.line()}", flush=True)
        if not all(o.ok.get(c) for c in CHECKS):
            with open(os.path.join(work, "console.txt"), "w") as f:
                f.write(o.output)
    n = args.runs
    print(f"{n} runs: {n - totals['segv']} with a SIGSEGV; survivors' last line names rank "
          f"{KILLED} in {totals['last_line']}; culprits == [{KILLED}] in {totals['culprits']}; "
          f"restart completed in {totals['restart']}; every file pointed to exists in "
          f"{totals['files']}; dead rank's position consistent in {totals['position']}; "
          f"attempts line whole in {totals['attempts']} (logs: {root})")
    return 0 if all(v == n for v in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
