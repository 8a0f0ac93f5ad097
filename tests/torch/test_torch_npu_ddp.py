"""DDP on npu tensors at worlds 2 and 3 under npurun equals the same script on CPU tensors with
gloo under torchrun (examples/train_torch_ddp.py --device npu: torch.npu.set_device(local_rank),
.to(f"npu:{local_rank}"), DDP(device_ids=[local_rank]), backend "hccl", torch.save/torch.load
with and without map_location every 2 steps).

World 2: every rank's loss of every step and the final parameters are bitwise gloo's.
World 3: the losses are gloo's bitwise; the final parameters equal npu+hccl's on CPU tensors
(the device adds nothing) and differ from gloo's in the last bits of some values, because the
two backends add three ranks' gradients in different orders: hccl computes (g0 + g1) + g2 for
every element, gloo's ring starts each chunk at another rank, and float64 addition is not
associative. ``test_world_3_sum_order`` shows this on one all_reduce. The world-3 tests are
slow (``python -m pytest -m slow tests/torch/test_torch_npu_ddp.py``).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")

from tests.leakcheck import LeakCheck, run_npurun  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_torch_ddp.py")
PROBE = os.path.join(ROOT, "tests", "torch", "npu_sum_probe.py")
ARGS = ["--steps", "6", "--hidden", "32", "--print-losses", "--reload-every", "2"]


def _torchrun(world, script, *args, env, cwd):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(world), script, *args]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=200)


def _train(tmp_path, world, on_npu_job: bool, device: str):
    params = tmp_path / f"params-{world}-{device}-{'npurun' if on_npu_job else 'torchrun'}.pt"
    args = [*ARGS, "--batch", str(32 * world), "--params-out", str(params)]
    with LeakCheck() as lc:
        env = dict(lc.env, PYTHONPATH=ROOT)
        if on_npu_job:
            res = run_npurun("--nproc-per-node", str(world), EXAMPLE, "--device", device, *args,
                             env=env, cwd=str(tmp_path), timeout=200)
        else:
            res = _torchrun(world, EXAMPLE, "--backend", "gloo", *args, env=env,
                            cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    # torchrun's ranks share one pipe: a line may run into the next one
    losses = sorted(re.findall(r"loss rank (\d+) step (\d+) (-?0x[0-9a-f.]+p[-+]\d+)",
                               res.stdout))
    assert len(losses) == 6 * world, res.stdout[-2000:]
    return losses, torch.load(params)


def _bits(t):
    return t.view(torch.int64)


@pytest.mark.timeout(600)
def test_world_2_npu_hccl_is_cpu_gloo_bitwise(tmp_path):
    npu_losses, npu_params = _train(tmp_path, 2, True, "npu")
    gloo_losses, gloo_params = _train(tmp_path, 2, False, "cpu")
    assert npu_losses == gloo_losses
    assert torch.equal(_bits(npu_params), _bits(gloo_params))


@pytest.mark.slow            # three launches of three ranks: minutes on a loaded machine
@pytest.mark.timeout(900)
def test_world_3_npu_hccl_is_cpu_hccl_and_gloo_up_to_the_sum_order(tmp_path):
    npu_losses, npu_params = _train(tmp_path, 3, True, "npu")
    cpu_losses, cpu_params = _train(tmp_path, 3, True, "cpu")
    gloo_losses, gloo_params = _train(tmp_path, 3, False, "cpu")
    assert npu_losses == cpu_losses == gloo_losses
    assert torch.equal(_bits(npu_params), _bits(cpu_params))
    rel = float(((npu_params - gloo_params).abs() / gloo_params.abs().max()).max())
    assert rel < 1e-13, rel            # last bits only (measured: 8e-15 relative, 6 steps)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_world_3_sum_order(tmp_path):
    """hccl's all_reduce on npu tensors is exactly (x0 + x1) + x2; gloo's differs in some
    elements, each of which is another order of the same three additions."""
    sys.path.insert(0, os.path.dirname(PROBE))
    try:
        import npu_sum_probe as probe
    finally:
        sys.path.pop(0)
    with LeakCheck() as lc:
        env = dict(lc.env, PYTHONPATH=ROOT)
        h = run_npurun("--nproc-per-node", "3", PROBE, str(tmp_path / "h.pt"), "npu", "hccl",
                       env=env, cwd=str(tmp_path), timeout=200)
        g = _torchrun(3, PROBE, str(tmp_path / "g.pt"), "cpu", "gloo", env=env,
                      cwd=str(tmp_path))
    assert h.returncode == 0 and g.returncode == 0, (h.stderr[-2000:], g.stderr[-2000:])
    hccl_sum, gloo_sum = torch.load(tmp_path / "h.pt"), torch.load(tmp_path / "g.pt")
    x0, x1, x2 = (probe.values(r) for r in range(3))
    assert torch.equal(_bits(hccl_sum), _bits((x0 + x1) + x2))
    orders = [(x0 + x1) + x2, (x1 + x2) + x0, (x2 + x0) + x1]
    each = torch.stack([_bits(o) for o in orders]) == _bits(gloo_sum)
    assert bool(each.any(dim=0).all())               # every gloo value is one of the orders
    assert not bool(each[0].all())                   # and not always hccl's
