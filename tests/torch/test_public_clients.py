"""Public clients run on simulated NPUs as on CPU + gloo, bit for bit (tests/clients/SOURCES.md).

Each test runs one vendored public script twice: under npurun on npusim's npu device (with the
one documented line, ``from torch_npu.contrib import transfer_to_npu``, for a CUDA script) and
under torchrun on CPU tensors with gloo (the file as vendored, tests/clients/ref_shim.py mapping
cuda to CPU for that run only), then asserts that every rank's losses, final DDP parameters and
saved snapshot are bitwise equal. The harness is tests/clients/run_clients.py (also a CLI).
"""
from __future__ import annotations

import hashlib
import math
import os
import sys

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS_DIR = os.path.join(os.path.dirname(HERE), "clients")
sys.path.insert(0, CLIENTS_DIR)

import run_clients  # noqa: E402
from tests.leakcheck import LeakCheck  # noqa: E402

# upstream git blob ids (pytorch/examples@77f55b9): the vendored files are byte-for-byte copies
UPSTREAM_BLOBS = {
    "pytorch_examples/distributed/ddp/example.py": "d64b4739769e3c36cc5522605edd43582895b59b",
    "pytorch_examples/distributed/ddp-tutorial-series/multigpu_torchrun.py":
        "32d6254d2dc43b104655bb7aec41a00b492e8dc4",
    "pytorch_examples/distributed/ddp-tutorial-series/datautils.py":
        "22c364eaa0d36bdcb5726f9f23972fe6b5d50615",
    "pytorch_examples/LICENSE": "1ba2484d4697a92afd0bf6be291eca930315534c",
}


def _blob(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_vendored_files_are_upstream_bytes():
    for rel, want in UPSTREAM_BLOBS.items():
        assert _blob(os.path.join(CLIENTS_DIR, rel)) == want, rel


@pytest.mark.parametrize("name", sorted(run_clients.CLIENTS))
def test_npu_variant_differs_by_the_one_line(name):
    c = run_clients.CLIENTS[name]
    with open(os.path.join(CLIENTS_DIR, c["dir"], c["script"]), encoding="utf-8") as f:
        original = f.read().splitlines()
    edited = run_clients.npu_variant("\n".join(original) + "\n", c["edit"]).splitlines()
    assert len(edited) == len(original) + 1
    i = original.index("import torch")
    assert edited[:i + 1] == original[:i + 1]
    assert edited[i + 1] in ("from torch_npu.contrib import transfer_to_npu", "import torch_npu")
    assert edited[i + 1] == c["edit"]
    assert edited[i + 2:] == original[i + 1:]


def test_npu_variant_needs_an_import_torch_line():
    with pytest.raises(ValueError, match="no 'import torch' line"):
        run_clients.npu_variant("import numpy\n")



def _both(name: str, world: int, tmp_path) -> dict:
    runs = {}
    with LeakCheck() as lc:
        for mode in ("ref", "npu"):
            runs[mode] = run_clients.run(name, mode, world, str(tmp_path / mode), env=lc.env,
                                         timeout=400)
    return runs


def _assert_equal(runs: dict) -> None:
    diffs = run_clients.compare(runs["npu"], runs["ref"])
    assert not diffs, "npu run differs from CPU + gloo:\n" + "\n".join(diffs[:30])


def _ranks_differ(records) -> bool:
    """True when the ranks saw different data (their first losses differ)."""
    first = [r["losses"][0] for r in records]
    return any(not bool((a == first[0]).all()) for a in first[1:])


@pytest.mark.timeout(420)
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_ddp_example(world, tmp_path):
    """pytorch/examples distributed/ddp/example.py: one DDP step of a ToyModel."""
    runs = _both("ddp-example", world, tmp_path)
    (records,) = runs["npu"].records
    assert len(records) == world
    for r in records:
        assert len(r["losses"]) == 1 and len(r["state"]) == 1
        assert set(r["state"][0]) == {"net1.weight", "net1.bias", "net2.weight", "net2.bias"}
    assert _ranks_differ(records)            # different data per rank: the all-reduce matters
    for r in records[1:]:                    # DDP keeps the replicas identical
        diffs: list[str] = []
        run_clients._same(r["state"], records[0]["state"], "state", diffs)
        assert not diffs, diffs
    _assert_equal(runs)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ddp_example_with_import_torch_npu_alone(tmp_path):
    """example.py asks torch.accelerator for its device and backend: ``import torch_npu`` (the
    npu becomes the accelerator, "hccl" its default backend) is all it needs."""
    runs = _both("ddp-example-import", 2, tmp_path)
    assert "backend=hccl" in runs["npu"].outputs[0][0]
    _assert_equal(runs)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_tutorial(world, tmp_path):
    """pytorch/examples ddp-tutorial-series/multigpu_torchrun.py: 2 epochs, DataLoader, snapshot."""
    runs = _both("ddp-tutorial", world, tmp_path)
    (records,) = runs["npu"].records
    steps = 2 * math.ceil(math.ceil(2048 / world) / 32)   # DistributedSampler, batch 32, 2 epochs
    for r in records:
        assert len(r["losses"]) == steps
    assert records[0]["files"]["snapshot.pt"]["EPOCHS_RUN"] == 1   # rank 0 saved after epoch 1
    _assert_equal(runs)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ddp_tutorial_resumes_from_its_snapshot(tmp_path):
    """The tutorial's second run loads the first one's snapshot with map_location="cuda:N"."""
    runs = _both("ddp-tutorial-resume", 2, tmp_path)
    first, second = runs["npu"].records
    assert "Resuming training from snapshot" in runs["npu"].outputs[1][0]
    assert first[0]["files"]["snapshot.pt"]["EPOCHS_RUN"] == 0
    _assert_equal(runs)


_PIN_AND_LOAD = r"""
import sys, torch
from torch_npu.contrib import transfer_to_npu
from torch.utils.data import DataLoader, TensorDataset
torch.cuda.set_device(0)
x = torch.arange(24.0).reshape(6, 4)
(batch,) = next(iter(DataLoader(TensorDataset(x), batch_size=6, pin_memory=True)))
assert batch.device.type == "cpu" and torch.equal(batch, x), batch
m = torch.nn.Linear(4, 2).cuda()
torch.save({"state": m.state_dict()}, sys.argv[1])
for loc in ("cuda:0", torch.device("cuda", 0), {"npu:0": "cuda:0"}):
    w = torch.load(sys.argv[1], map_location=loc)["state"]["weight"]
    assert w.device == torch.device("npu", 0) and torch.equal(w.cpu(), m.weight.cpu()), (loc, w)
opt = torch.optim.SGD(m.parameters(), lr=0.1)   # imports torch._dynamo: reads torch.cuda.amp
import torch._dynamo
with torch.cuda.amp.autocast():
    y = m(torch.randn(3, 4).cuda())
assert y.dtype == torch.float16 and y.device.type == "npu", y
print("ok")
"""


@pytest.mark.timeout(120)
def test_transfer_to_npu_what_the_clients_need_beyond_ddp(tmp_path):
    """DataLoader(pin_memory=True) with the npu as torch's accelerator; under transfer_to_npu,
    torch.load(map_location="cuda:N"), and an optimizer (it imports torch._dynamo, which reads
    torch.cuda.amp.autocast_mode) next to torch.cuda.amp.autocast on the npu."""
    import subprocess
    p = subprocess.run([sys.executable, "-c", _PIN_AND_LOAD, str(tmp_path / "ckpt.pt")],
                       env=run_clients.environment(), capture_output=True, text=True, timeout=100)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
