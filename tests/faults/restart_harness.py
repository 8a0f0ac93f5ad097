"""Kill ranks of a checkpointing training example under ``npurun --max-restarts``; compare digests.

One run: start ``npurun --max-restarts 3 EXAMPLE --checkpoint-dir D ...``; once a checkpoint
exists, SIGKILL a random rank of the running attempt after a random delay; once the next attempt
printed ``resumed from step N``, do it again (``kills`` times in all). The run must exit 0 with
the ``final params sha256`` of an unfaulted run. Each kill's cost is measured from the SIGKILL
to the first progress line of the resumed attempt (its first step done).

    python -m tests.faults.restart_harness --example train_ddp --runs 20
    python -m tests.faults.restart_harness --example train_torch_ddp --runs 20

prints one line per run and the median failure -> resumed-first-step time; exit 1 on any
difference (docs/reliability.md, "Nothing lost").
"""
from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from tests.leakcheck import LeakCheck, npurun_cmd, tagged_pids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGEST = re.compile(r"final params sha256: ([0-9a-f]{64})")
RESUMED = re.compile(r"\[rank 0\]: resumed from step (\d+)")

# short runs of each example: (nproc, arguments); a run trains for a few seconds here
EXAMPLES = {
    # long enough that a kill 0-1.5 s after a checkpoint lands inside the run on an idle machine
    # too (240 steps took 0.6 s there)
    "train_ddp": (2, ["--steps", "2000", "--hidden", "32", "--batch", "256",
                      "--checkpoint-every", "50"]),
    "train_torch_ddp": (2, ["--steps", "240", "--hidden", "32", "--batch", "64",
                            "--checkpoint-every", "10"]),
}


@dataclass
class RunOutcome:
    returncode: int
    digest: str | None
    kills: list = field(default_factory=list)       # (attempt, rank, time.time() of the kill)
    resumed: list = field(default_factory=list)     # (step, time of the line)
    first_steps: list = field(default_factory=list)  # time of each resumed first step's line
    output: str = ""
    timeline: list = field(default_factory=list)    # (arrival time, line) of every line
    started: float = 0.0                            # time.time() at npurun's start

    def startup(self) -> float | None:
        """Seconds from npurun's start to rank 0's first line: a cold start, for comparison."""
        first = next((t for t, line in self.timeline if line.startswith("[rank 0]:")), None)
        return None if first is None else first - self.started

    def detections(self) -> list[float]:
        """Seconds from each kill to npurun's ``restarting the job`` line (its own share)."""
        lines = [t for t, line in self.timeline if line.startswith("npurun: restarting the job")]
        return [t1 - t0 for (_, _, t0), t1 in zip(self.kills, lines)]

    def recoveries(self) -> list[float]:
        """Seconds from each kill to the first step the next attempt completed."""
        return [t1 - t0 for (_, _, t0), t1 in zip(self.kills, self.first_steps)]


def example_path(name: str) -> str:
    return os.path.join(ROOT, "examples", f"{name}.py")


class _Lines:
    """Reads npurun's two pipes in threads; every line with its arrival time."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.threads = [threading.Thread(target=self._read, args=(p,), daemon=True)
                        for p in (proc.stdout, proc.stderr)]
        for t in self.threads:
            t.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            with self.cond:
                self.lines.append((time.time(), line))
                self.cond.notify_all()

    def text(self) -> str:
        for t in self.threads:
            t.join(timeout=10)
        return "".join(line for _, line in self.lines)


def _ranks(tag: str, attempt: int) -> dict[int, int]:
    """{rank: pid} of the workers of ``attempt`` (read from their environment)."""
    out = {}
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--fork-server" in f.read():   # it shows rank 0's environment
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if env.get(b"TORCHELASTIC_RESTART_COUNT") == str(attempt).encode():
            out[int(env[b"RANK"])] = pid
    return out


def _wait(predicate, proc: subprocess.Popen, deadline: float):
    """Poll until ``predicate()`` is true (returned), the job ended (None) or the deadline."""
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the job to reach the next kill point")


def run_once(example: str, ckpt_dir: str, *, kills: int, rng: random.Random,
             window: float = 1.5, timeout: float = 400, cwd: str | None = None) -> RunOutcome:
    """One npurun job of ``example`` with ``kills`` random SIGKILLs (0: an unfaulted run)."""
    nproc, args = EXAMPLES[example]
    cmd = npurun_cmd("--nproc-per-node", str(nproc), "--max-restarts", "3",
                     example_path(example), *args, "--checkpoint-dir", ckpt_dir)
    deadline = time.monotonic() + timeout
    cwd = cwd or os.path.dirname(os.path.abspath(ckpt_dir))   # where hang_report.json goes
    os.makedirs(cwd, exist_ok=True)
    with LeakCheck(grace=15) as lc:
        proc = subprocess.Popen(cmd, env=lc.env, cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines = _Lines(proc)
        out = RunOutcome(returncode=-1, digest=None, started=time.time())
        try:
            for attempt in range(kills):
                if attempt == 0:     # after checkpoints exist
                    ready = _wait(lambda: any(n.endswith(".json") for n in os.listdir(ckpt_dir))
                                  if os.path.isdir(ckpt_dir) else False, proc, deadline)
                else:                # the restarted attempt has resumed
                    ready = _wait(lambda: _resumed_count(lines) >= attempt, proc, deadline)
                ranks = _wait(lambda: (lambda r: r if len(r) == nproc else None)(
                    _ranks(lc.tag, attempt)), proc, deadline) if ready else None
                if not ranks:
                    raise AssertionError(f"the job ended before kill {attempt + 1}: make the "
                                         f"run longer\n" + lines.text())
                time.sleep(rng.uniform(0.0, window))
                victim = rng.randrange(nproc)
                try:
                    os.kill(ranks[victim], signal.SIGKILL)
                except ProcessLookupError:
                    raise AssertionError(f"rank {victim} of attempt {attempt} ended before its "
                                         f"kill: make the run longer\n" + lines.text()) from None
                out.kills.append((attempt, victim, time.time()))
            out.returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.output = lines.text()
    out.timeline = list(lines.lines)
    out.digest = _last(DIGEST, out.output)
    _resume_times(out, lines)
    return out


def _resumed_count(lines: _Lines) -> int:
    with lines.cond:
        return sum(1 for _, line in lines.lines if RESUMED.search(line))


def _last(pattern: re.Pattern, text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1] if found else None


def _resume_times(out: RunOutcome, lines: _Lines) -> None:
    """After each ``resumed from step N`` line: the first progress line of rank 0 (step N+1)."""
    rows = lines.lines
    for i, (t, line) in enumerate(rows):
        m = RESUMED.search(line)
        if not m:
            continue
        out.resumed.append((int(m.group(1)), t))
        first = re.compile(rf"\[rank 0\]: step {int(m.group(1)) + 1}/")
        out.first_steps.append(next((t2 for t2, l2 in rows[i:] if first.search(l2)), t))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="random SIGKILLs under npurun --max-restarts: "
                                            "final digests must equal an unfaulted run's")
    p.add_argument("--example", choices=sorted(EXAMPLES), default="train_ddp")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    a = p.parse_args(argv)
    import tempfile
    work = a.dir or tempfile.mkdtemp(prefix="restart-harness-")
    rng = random.Random(a.seed)
    ref = run_once(a.example, os.path.join(work, "ref"), kills=0, rng=rng)
    if ref.returncode or not ref.digest:
        print(ref.output)
        return 1
    print(f"unfaulted: {ref.digest}; cold start to rank 0's first line {ref.startup():.1f} s",
          flush=True)
    diffs, costs, starts, npurun_share = 0, [], [ref.startup()], []
    for i in range(a.runs):
        o = run_once(a.example, os.path.join(work, f"run{i}"), kills=a.kills, rng=rng)
        same = o.returncode == 0 and o.digest == ref.digest
        diffs += not same
        costs += o.recoveries()
        starts.append(o.startup())
        npurun_share += o.detections()
        kills = ", ".join(f"attempt {k} rank {r}" for k, r, _ in o.kills)
        steps = ", ".join(str(s) for s, _ in o.resumed)
        print(f"run {i}: exit {o.returncode}, killed {kills}; resumed from {steps}; "
              f"{'same digest' if same else 'DIFFERENT: ' + str(o.digest)}; recovery "
              + ", ".join(f"{c:.1f} s" for c in o.recoveries())
              + f"; cold start {o.startup():.1f} s", flush=True)
        if not same:
            print(o.output[-4000:])
    print(f"{a.runs} runs, {diffs} differences; failure -> resumed first step: median "
          f"{statistics.median(costs):.1f} s over {len(costs)} kills (min {min(costs):.1f}, "
          f"max {max(costs):.1f}); of which kill -> npurun restarting: median "
          f"{statistics.median(npurun_share):.1f} s; cold start: median "
          f"{statistics.median(starts):.1f} s"
          if costs else f"{a.runs} runs, {diffs} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
