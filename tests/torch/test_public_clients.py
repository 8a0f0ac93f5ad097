"""Public clients run on simulated NPUs as on CPU + gloo, bit for bit (tests/clients/SOURCES.md).

Each client test runs one public script twice: under npurun on npusim's npu device (with the
one documented line, ``from torch_npu.contrib import transfer_to_npu``, for a CUDA script) and
under torchrun on CPU tensors with gloo (the file as upstream has it, tests/clients/ref_shim.py
mapping cuda to CPU for that run only), then asserts that every rank's losses, final DDP
parameters and saved snapshot are bitwise equal. The harness is tests/clients/run_clients.py
(also a CLI). Ascend/ModelZoo-PyTorch's ShuffleNetV2 main.py, a torch_npu script, runs with no
edit at all; its tests skip, naming the install command, without torchvision.

The scripts are not in this repository: the client tests read them from clones under
$NPUSIM_CLIENT_SOURCES (checked against run_clients.BLOBS) and skip, naming the clone commands,
without them. The harness's own unit tests below run without them.
"""
from __future__ import annotations

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


def _needs(name: str) -> None:
    """Skip unless client ``name``'s sources (and any module it imports) are here."""
    why = run_clients.unavailable(name)
    if why:
        pytest.skip(why)


def test_git_blob_is_git_hash_object():
    assert run_clients.git_blob(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert run_clients.git_blob(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_every_client_file_has_a_recorded_blob():
    for name, c in run_clients.CLIENTS.items():
        assert c["repo"] in run_clients.REPOS, name
        for rel in c["files"]:
            blob = run_clients.BLOBS[(c["repo"], f"{c['dir']}/{rel}")]
            assert len(blob) == 40 and int(blob, 16) >= 0, (name, rel)


def _fake_sources(tmp_path, text: bytes):
    """A sources root holding ``text`` where ddp-example's example.py belongs."""
    path = tmp_path / "pytorch" / "examples" / "distributed" / "ddp" / "example.py"
    path.parent.mkdir(parents=True)
    path.write_bytes(text)
    return str(tmp_path), str(path)


def test_a_missing_sources_root_names_the_clone_commands(tmp_path, monkeypatch):
    monkeypatch.delenv(run_clients.SOURCES_ENV, raising=False)
    with pytest.raises(run_clients.SourcesError, match="NPUSIM_CLIENT_SOURCES") as e:
        run_clients.sources_root()
    for repo, commit in run_clients.REPOS.items():
        assert f"git clone https://github.com/{repo}.git DIR/{repo}" in str(e.value)
        assert f"git -C DIR/{repo} checkout {commit}" in str(e.value)
    gone = str(tmp_path / "nope")
    with pytest.raises(run_clients.SourcesError, match="is not a directory"):
        run_clients.sources_root(gone)
    monkeypatch.setenv(run_clients.SOURCES_ENV, str(tmp_path))
    assert run_clients.sources_root() == str(tmp_path)
    with pytest.raises(run_clients.SourcesError,
                       match="(?s)ddp-tutorial-series/multigpu_torchrun.py is missing.*"
                             "git clone https://github.com/pytorch/examples.git"):
        run_clients.client_files("ddp-tutorial")
    assert "is missing" in run_clients.unavailable("ddp-tutorial")


def test_a_changed_file_is_refused_with_both_blob_ids(tmp_path):
    root, path = _fake_sources(tmp_path, b"x\n")
    want = run_clients.BLOBS[("pytorch/examples", "distributed/ddp/example.py")]
    with pytest.raises(run_clients.SourcesError) as e:
        run_clients.prepare("ddp-example", "ref", str(tmp_path / "work"), root)
    msg = str(e.value)
    assert path in msg and want in msg and "587be6b4c3f93f93c489c0111bba5596147a26cb" in msg
    assert f"checkout {run_clients.REPOS['pytorch/examples']}" in msg
    assert not (tmp_path / "work" / "src").exists()


def test_prepare_copies_the_checked_bytes_and_edits_only_the_npu_copy(tmp_path, monkeypatch):
    text = b"import os\nimport torch\r\nprint(torch.__version__)\n"
    root, _ = _fake_sources(tmp_path, text)
    key = ("pytorch/examples", "distributed/ddp/example.py")
    monkeypatch.setitem(run_clients.BLOBS, key, run_clients.git_blob(text))
    ref = run_clients.prepare("ddp-example", "ref", str(tmp_path / "ref"), root)
    npu = run_clients.prepare("ddp-example", "npu", str(tmp_path / "npu"), root)
    assert open(ref, "rb").read() == text
    assert open(npu, "rb").read() == (b"import os\nimport torch\r\n" + run_clients.EDIT.encode()
                                      + b"\r\nprint(torch.__version__)\n")


@pytest.mark.parametrize("name", sorted(n for n, c in run_clients.CLIENTS.items() if c["edit"]))
def test_npu_variant_differs_by_the_one_line(name):
    _needs(name)
    c = run_clients.CLIENTS[name]
    original = run_clients.client_files(name)[c["files"][0]].decode("utf-8").splitlines()
    edited = run_clients.npu_variant("\n".join(original) + "\n", c["edit"]).splitlines()
    assert len(edited) == len(original) + 1
    i = original.index("import torch")
    assert edited[:i + 1] == original[:i + 1]
    assert edited[i + 1] in ("from torch_npu.contrib import transfer_to_npu", "import torch_npu")
    assert edited[i + 1] == c["edit"]
    assert edited[i + 2:] == original[i + 1:]


def test_only_a_finished_gloo_reference_passes_a_gloo_exit_abort(tmp_path, capsys):
    abort = "...\nterminate called without an active exception\n"
    for r in range(2):
        (tmp_path / f"rank{r}.pt").write_bytes(b"")
    assert run_clients.gloo_exit_abort("ref", abort, str(tmp_path), 2)
    assert "aborted at exit" in capsys.readouterr().err
    assert not run_clients.gloo_exit_abort("npu", abort, str(tmp_path), 2)
    assert not run_clients.gloo_exit_abort("ref-hccl", abort, str(tmp_path), 2)
    assert not run_clients.gloo_exit_abort("ref", "Traceback ...", str(tmp_path), 2)
    assert not run_clients.gloo_exit_abort("ref", abort, str(tmp_path), 3)    # rank 2 missing


def test_npu_variant_needs_an_import_torch_line():
    with pytest.raises(ValueError, match="no 'import torch' line"):
        run_clients.npu_variant("import numpy\n")


def test_torch_npu_script_runs_unchanged(tmp_path):
    """The ModelZoo script is a torch_npu script: the npu run gets upstream's file itself."""
    assert run_clients.CLIENTS["shufflenetv2-npu"]["edit"] is None
    _needs("shufflenetv2-npu")
    script = run_clients.prepare("shufflenetv2-npu", "npu", str(tmp_path))
    with open(script, "rb") as f:
        data = f.read()
    key = ("Ascend/ModelZoo-PyTorch", f"{run_clients.SHUFFLENET}/main.py")
    assert run_clients.git_blob(data) == run_clients.BLOBS[key]
    assert b"import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n" in data


def test_torch_npu_options():
    """torch_npu.npu.set_compile_mode / set_option / torch.npu.config, as ModelZoo scripts call
    them at start-up: recorded and read back; they change nothing else (docs: options.py)."""
    pytest.importorskip("torch_npu")
    import torch
    import torch_npu
    from torch_npu.npu import options
    saved = dict(options._options)
    options._options.clear()
    try:
        assert torch.npu.config.allow_internal_format is None and torch.npu.get_option("x") is None
        torch_npu.npu.set_compile_mode(jit_compile=False)
        assert torch.npu.is_jit_compile_false() and torch.npu.get_option("jitCompile") == "disable"
        torch_npu.npu.set_compile_mode(jit_compile=True)
        assert not torch.npu.is_jit_compile_false()
        torch.npu.config.allow_internal_format = False
        assert torch.npu.config.allow_internal_format is False
        assert torch.npu.get_option("ALLOW_INTERNAL_FORMAT") == "disable"
        torch.npu.config.allow_internal_format = True
        assert torch.npu.config.allow_internal_format is True
        torch.npu.set_option({"ACL_OP_COMPILER_CACHE_MODE": "enable"})
        assert torch.npu.get_option("ACL_OP_COMPILER_CACHE_MODE") == "enable"
        assert torch.npu.get_option("NO_SUCH_OPTION") is None
        with pytest.raises(AttributeError, match="no option 'allow_internal_fromat'"):
            torch.npu.config.allow_internal_fromat = False
        with pytest.raises(TypeError, match="dict of option names.*got list"):
            torch.npu.set_option(["jitCompile"])
        x = torch.arange(6.0, device="npu").reshape(2, 3)
        torch_npu.npu.set_compile_mode(jit_compile=False)    # synchronizes, as torch_npu does
        assert x.sum().item() == 15.0
    finally:
        options._options.clear()
        options._options.update(saved)


def _both(name: str, world: int, tmp_path) -> dict:
    _needs(name)
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


@pytest.mark.timeout(420)
def test_modelzoo_shufflenetv2_torch_npu_script(tmp_path):
    """Ascend/ModelZoo-PyTorch's ShuffleNetV2_iflytek main.py, a torch_npu training script, as it
    is: ``--dummy`` (torchvision FakeData), DDP on "nccl" made hccl by its own transfer_to_npu,
    3 SGD steps at world 2 (tests/clients/SOURCES.md). Needs torchvision and Pillow."""
    _needs("shufflenetv2-npu")
    runs = _both("shufflenetv2-npu", 2, tmp_path)
    (records,) = runs["npu"].records
    (ref,) = runs["ref"].records
    for rank, (r, g) in enumerate(zip(records, ref)):
        assert len(r["losses"]) == 3 and len(r["state"]) == 1
        assert r["where"] == {"devices": [[f"npu:{rank}"]], "backend": "hccl"}
        assert g["where"] == {"devices": [["cpu"]], "backend": "gloo"}
        assert len(r["state"][0]) == 338                     # 56 BatchNorms: buffers too
    assert _ranks_differ(records)
    out = runs["npu"].outputs[0][0]
    assert "Dummy data is used!" in out and "using CPU" not in out
    _assert_equal(runs)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_modelzoo_shufflenetv2_world_3(tmp_path):
    """At world 3 the npu run is bitwise the same file on CPU tensors with npusim's hccl (under
    npurun); gloo's ring adds three ranks' gradients in another order than hccl's
    (x0 + x1) + x2 (docs/torch.md), so vs CPU + gloo the first loss (before any all-reduce)
    agrees bitwise and the second, after one all-reduce of the gradients, to the last bits
    (equal in one environment, 1 ulp apart in another: tests/clients/SOURCES.md)."""
    _needs("shufflenetv2-npu")
    runs = {}
    with LeakCheck() as lc:
        for mode in ("ref", "ref-hccl", "npu"):
            runs[mode] = run_clients.run("shufflenetv2-npu", mode, 3, str(tmp_path / mode),
                                         env=lc.env, timeout=600)
    (records,) = runs["npu"].records
    for rank, r in enumerate(records):
        assert r["where"] == {"devices": [[f"npu:{rank}"]], "backend": "hccl"}
    assert runs["ref-hccl"].records[0][0]["where"] == {"devices": [["cpu"]], "backend": "hccl"}
    diffs = run_clients.compare(runs["npu"], runs["ref-hccl"])
    assert not diffs, "npu run differs from CPU + hccl:\n" + "\n".join(diffs[:30])
    for r, g in zip(records, runs["ref"].records[0]):
        assert g["where"]["backend"] == "gloo"
        assert run_clients._bits(r["losses"][0]) == run_clients._bits(g["losses"][0])
        assert math.isclose(r["losses"][1], g["losses"][1], rel_tol=1e-6), \
            (r["losses"][1], g["losses"][1])
