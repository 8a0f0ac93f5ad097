"""Every shell command in README.md's ```bash blocks runs, as itself or as a short variant.

VARIANTS maps each README command to the commands that stand for it here (fewer steps, fewer
ranks, smaller sizes), each with what a successful run prints. A command added to README
without a variant fails `test_every_readme_command_has_a_variant`, and a variant whose command
left README fails it too, so README and what is run cannot drift apart. The tour's Python block
is run as README says to run it (`tour.py`).
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.leakcheck import LeakCheck

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
PY = sys.executable
SMALL_DDP = "--steps 3 --hidden 32 --batch 256"


def _has(module: str) -> bool:
    """Installed (not a namespace package: tests/torch/ is one, tests/ being on sys.path)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin not in (None, "namespace")


def _tour_ready() -> str:
    """Why the tour cannot run here, or '' (it calls set_device() without an argument)."""
    import runtime
    params = inspect.signature(runtime.set_device).parameters.values()
    if any(p.default is inspect.Parameter.empty for p in params):
        return "runtime.set_device() needs an argument in this checkout (issue 27's world of one)"
    return ""


NO_TORCH = "" if _has("torch") else "torch is not installed (docs/torch.md: the CPU build)"
NEEDS_TORCH = ("examples/train_torch_ddp.py",)    # README commands whose variants get needs_torch
NO_PEERS = "" if _has("torch") and _has("mpi4py") and shutil.which("mpirun") else \
    "the peers are not installed (bash benchmarks/peers/setup.sh)"

# README command -> [(variant run with bash from the repository root, text its output shows,
#                     expected success, reason to skip or '')]
VARIANTS = {
    "pip install -e '.[test]' && npurun --nproc-per-node 4 examples/train_ddp.py": [
        # what the install left, checked offline (a pip dry run needs `wheel` in a fresh venv)
        (f"{PY} tests/e2e/check_install.py", "install check: OK, with the [test] extra", True, ""),
        (f"npurun --nproc-per-node 2 examples/train_ddp.py {SMALL_DDP}", "final loss", True, "")],
    "python -m pytest": [
        (f"{PY} -m pytest -p no:cacheprovider --collect-only -q tests/unit/test_figures.py",
         "tests/unit/test_figures.py", True, "")],
    "npurun --nproc-per-node 4 tour.py": [
        ("npurun --nproc-per-node 2 {tour}", "[rank 1]: 1 [2. 2. 2. 2.]", True, "tour")],
    "python tour.py": [(f"{PY} {{tour}}", "0 [0. 0. 0. 0.]", True, "tour")],
    "npurun --nproc-per-node 4 examples/train_ddp.py --check": [
        (f"npurun --nproc-per-node 2 examples/train_ddp.py --check {SMALL_DDP}", "bitwise", True,
         "")],
    "HCCL_EXEC_TIMEOUT=10 npurun --nproc-per-node 4 examples/hang_demo.py sleep": [
        ("HCCL_EXEC_TIMEOUT=4 npurun --nproc-per-node 3 examples/hang_demo.py sleep",
         "culprit rank(s): [2]", False, "")],
    "python examples/multistream_overlap.py": [
        (f"{PY} examples/multistream_overlap.py --chunks 4 --chunk-mb 1 --repeat 2", "speed-up",
         True, "")],
    "python examples/acl_streams.py": [(f"{PY} examples/acl_streams.py", "data round trip OK",
                                        True, "")],
    "npurun --nproc-per-node 4 examples/train_torch_ddp.py --check": [
        (f"npurun --nproc-per-node 2 examples/train_torch_ddp.py --check {SMALL_DDP}", "bitwise",
         True, NO_TORCH)],
    "npurun --nproc-per-node 2 examples/train_torch_ddp.py --device npu --check": [
        (f"npurun --nproc-per-node 2 examples/train_torch_ddp.py --device npu --check {SMALL_DDP}",
         "bitwise", True, NO_TORCH)],
    "python -m runtime.bench": [
        (f"{PY} -m runtime.bench --iters 100", "empty Python function call", True, "")],
    "npurun --nproc-per-node 2 -m hccl.bench --sizes 1K,1M,16M --timing median": [
        ("npurun --nproc-per-node 2 -m hccl.bench --sizes 1K,1M --timing median -n 3 -w 1",
         "busbw", True, "")],
    "bash benchmarks/compare.sh": [
        ("FIGURES_DIR={tmp} bash benchmarks/compare.sh --worlds 2 --colls all_reduce --sizes 1K "
         "--rounds 1 --target-s 0.02 --no-ceiling", "| 2 | all_reduce | 1 KiB | us |", True,
         NO_PEERS)],
    "python -m benchmarks.stress --jobs 100 --worlds 2,3,4,5 --shm on,off": [
        (f"{PY} -m benchmarks.stress --jobs 2 --worlds 2 --shm on,off --short --cases-per-job 1",
         "all", True, "")],
}


def readme_commands(text: str = README) -> list[str]:
    """The commands of every ```bash block, one per line (comments and blank lines dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        out += [ln.strip() for ln in block.splitlines() if ln.strip() and
                not ln.strip().startswith("#")]
    return out


def test_every_readme_command_has_a_variant():
    cmds = readme_commands()
    assert len(cmds) == len(set(cmds)), f"a README command appears twice: {cmds}"
    assert set(cmds) - set(VARIANTS) == set(), "README commands without a variant in this test"
    assert set(VARIANTS) - set(cmds) == set(), "variants of commands README no longer has"


def test_every_variant_says_what_its_output_shows():
    empty = [v[0] for vs in VARIANTS.values() for v in vs if not v[1].strip()]
    assert empty == [], "a variant's expected output is empty, so its check cannot fail"


def test_the_parser_reads_bash_blocks_only():
    text = "```bash\nnpurun a\n# note\n\npython b\n```\n```python\nx = 1\n```\n```\nls\n```"
    assert readme_commands(text) == ["npurun a", "python b"]


def _tour(tmp_path) -> str:
    code = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(code) == 1, "README should have exactly one Python block: the tour"
    path = tmp_path / "tour.py"
    path.write_text(code[0])
    return str(path)


CASES = [(cmd, i) for cmd, vs in VARIANTS.items() for i in range(len(vs))]
SLOW = ("bash benchmarks/compare.sh", "python -m benchmarks.stress")   # the full run only
CASES = [pytest.param(c, i, marks=pytest.mark.slow) if c.startswith(SLOW) else
         pytest.param(c, i, marks=pytest.mark.needs_torch) if any(t in c for t in NEEDS_TORCH)
         else (c, i) for c, i in CASES]


@pytest.mark.timeout(600)   # loaded CI machines: the comparison starts six interpreters
@pytest.mark.parametrize("cmd,index", CASES, ids=[
    f"{(c.values if hasattr(c, 'values') else c)[0][:40]}-{(c.values if hasattr(c, 'values') else c)[1]}"
    for c in CASES])
def test_readme_command_runs(cmd, index, tmp_path):
    variant, shows, ok, skip = VARIANTS[cmd][index]
    if skip == "tour":
        skip = _tour_ready()
    if skip:
        pytest.skip(skip)
    line = variant.format(tour=_tour(tmp_path) if "{tour}" in variant else "", tmp=tmp_path)
    with LeakCheck(grace=10) as leaks:
        env = dict(leaks.env, PYTHON=PY)   # npurun and python of this interpreter's environment
        env["PATH"] = os.pathsep.join([os.path.dirname(PY), env.get("PATH", "")])
        p = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=580)
    out = p.stdout + p.stderr
    assert (p.returncode == 0) == ok, f"{line}: exit {p.returncode}\n{out[-3000:]}"
    assert shows in out, f"{line}: {shows!r} not in its output\n{out[-3000:]}"
