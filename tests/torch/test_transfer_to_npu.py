"""``from torch_npu.contrib import transfer_to_npu`` as far as torch_npu 2.14.0's reaches (issue 51).

transfer_to_npu patches torch for the whole process, so each check runs in a fresh interpreter
(``_run``) and reports plain values back.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_npu")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(body: str, **env) -> dict:
    code = ("import json, warnings\nwarnings.simplefilter('ignore')\nimport torch\n"
            "from torch_npu.contrib import transfer_to_npu\nout = {}\n" +
            textwrap.dedent(body) + "\nprint('RESULT', json.dumps(out))\n")
    e = dict(os.environ, PYTHONPATH=ROOT, **env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, env=e, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.timeout(300)
def test_every_torch_npu_name_is_on_torch_cuda():
    out = _run("""
        import torch_npu
        out["missing"] = [n for n in torch_npu.npu.__all__ if not hasattr(torch.cuda, n)]
        out["same"] = all(getattr(torch.cuda, n) is getattr(torch.npu, n) for n in
                          ("is_available", "Stream", "Event", "get_rng_state_all",
                           "FloatTensor", "MemPool", "set_stream", "memory_cached"))
        out["random"] = [n for n in torch_npu.npu.random.__all__
                         if getattr(torch.cuda.random, n) is not getattr(torch.npu.random, n)
                         and n not in ("get_rng_state", "set_rng_state")]
        out["amp"] = torch.cuda.amp.GradScaler is torch.npu.amp.GradScaler
        out["autocast_mode"] = torch.cuda.amp.autocast_mode.autocast is torch.npu.amp.autocast
        out["default_generators"] = torch.cuda.default_generators is torch.npu.default_generators
        out["double"] = torch.cuda.DoubleTensor is torch.npu.FloatTensor
        out["graph"] = torch.cuda.CUDAGraph is torch.npu.NPUGraph
        out["n_all"] = len(torch_npu.npu.__all__)
    """)
    assert out["missing"] == [] and out["n_all"] == 144
    assert out["same"] and out["random"] == [] and out["amp"] and out["autocast_mode"]
    assert out["default_generators"] and out["double"] and out["graph"]


@pytest.mark.timeout(300)
def test_cuda_device_arguments_become_npu():
    out = _run("""
        import io
        torch.cuda.set_device("cuda:0")
        out["current"] = torch.cuda.current_device()
        x = torch.randn(4, 4, device="cuda")
        out["randn"] = str(x.device)
        out["zeros_dev"] = str(torch.zeros(2, device=torch.device("cuda", 1)).device)
        out["to_int"] = str(torch.ones(2).to(1).device)
        out["new_ones"] = str(torch.ones(1).new_ones(3, device="cuda").device)
        out["module_to"] = str(next(torch.nn.Linear(2, 2).to("cuda:0").parameters()).device)
        out["dot_cuda"] = str(torch.ones(1).cuda().device)
        out["is_cuda"] = [x.is_cuda, torch.ones(1).is_cuda]
        buf = io.BytesIO(); torch.save(x, buf); buf.seek(0)
        out["load"] = str(torch.load(buf, map_location={"cuda:0": "cuda:1"}).device)
        with torch.device("cuda"):
            out["device_ctx"] = str(torch.empty(1).device)
        with torch.cuda.device("cuda:1"):
            out["cuda_device"] = torch.cuda.current_device()
        out["name"] = torch.cuda.get_device_name("cuda:0")
        out["props"] = torch.cuda.get_device_properties("cuda:0").name
        out["mem"] = torch.cuda.memory_allocated("cuda:0") > 0
        cap = torch.cuda.get_device_capability("cuda:0")
        out["cap"] = [cap[0], cap.major, cap.minor]
        s = torch.cuda.random.get_rng_state("cuda:0")
        torch.cuda.random.set_rng_state(s, "cuda:0")
        out["rng"] = int(s.numel())
        out["fftfreq"] = str(torch.fft.fftfreq(4, device="cuda").device)
        snap = torch.cuda.memory._snapshot("cuda:0")
        out["snapshot"] = [len(snap["segments"]) > 0, snap["device_traces"][0]]
        torch.cuda.memory._record_memory_history(enabled=None)
        try:
            torch.cuda.memory._record_memory_history(max_entries=100)
            out["history"] = "recorded"
        except NotImplementedError as e:
            out["history"] = str(e)
        out["storage"] = str(torch.UntypedStorage(8, device="cuda").device)
    """, TORCH_NPU_DEVICE_CAPABILITY="9.0")
    assert out["current"] == 0 and out["randn"] == "npu:0" and out["zeros_dev"] == "npu:1"
    assert out["to_int"] == "npu:1" and out["new_ones"] == "npu:0"
    assert out["module_to"] == "npu:0" and out["dot_cuda"] == "npu:0"
    assert out["is_cuda"] == [True, False]
    assert out["load"] == "npu:1" and out["device_ctx"] == "npu:0" and out["cuda_device"] == 1
    assert out["name"] == out["props"] == "Ascend910B1" and out["mem"]
    assert out["cap"] == [9, 9, 0] and out["rng"] > 0
    assert out["fftfreq"] == "npu:0" and out["storage"] == "npu:0"
    assert out["snapshot"] == [True, []] and "keeps no allocation history" in out["history"]


@pytest.mark.timeout(300)
def test_autocast_cuda_generator_and_a_cuda_training_step_bitwise():
    out = _run("""
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.cuda.amp.GradScaler()
        g = torch.Generator(device="cuda")
        g.manual_seed(5)
        out["gen_isinstance"] = isinstance(g, torch.Generator)
        x = torch.randn(16, 8, device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out["enabled"] = [torch.is_autocast_enabled(), torch.is_autocast_enabled("cuda"),
                              torch.is_autocast_enabled("npu")]
            y = model(x)
            out["y_dtype"] = str(y.dtype)
        out["gpu_dtype"] = str(torch.get_autocast_gpu_dtype())
        loss = y.float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        out["loss"] = loss.item()
        out["w"] = model[0].weight.detach().cpu().flatten().tolist()
        out["x"] = x.cpu().flatten().tolist()
        out["scaler_device"] = scaler._device
    """)
    assert out["gen_isinstance"] and out["enabled"] == [True, True, True]
    assert out["y_dtype"] == "torch.bfloat16" and out["scaler_device"] == "npu"
    # the same step on CPU, with torch's CPU autocast and generator
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(5))
    assert x.flatten().tolist() == out["x"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    loss = y.float().pow(2).mean()
    (loss * 65536.0).backward()          # the scaler's first scale, unscaled in step
    for p in model.parameters():
        p.grad /= 65536.0
    opt.step()
    assert loss.item() == out["loss"]
    assert model[0].weight.detach().flatten().tolist() == out["w"]


@pytest.mark.timeout(300)
def test_distributed_and_profiler_names():
    out = _run("""
        import torch.distributed as dist
        import torch_npu
        out["nccl"] = dist.is_nccl_available()
        out["pg"] = dist.ProcessGroupNCCL is torch_npu._C._distributed_c10d.ProcessGroupHCCL
        out["map"] = "cuda" in dist.Backend.default_device_backend_map
        seen = {}
        import torch.distributed.distributed_c10d as c10d
        real = transfer_to_npu._wrap_hccl(lambda *a, **k: seen.update(a=a, k=k))
        real("cpu:gloo,cuda:nccl")
        real(backend="nccl")
        out["backend"] = [seen["k"].get("backend"), transfer_to_npu._nccl_to_hccl("cpu:gloo,cuda:nccl")]
        out["activity"] = torch.profiler.ProfilerActivity.CUDA is torch_npu.profiler.ProfilerActivity.NPU
        out["profile"] = torch.profiler.schedule is torch_npu.profiler.schedule
        p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                               torch.profiler.ProfilerActivity.CUDA],
                                   experimental_config=object())
        out["profile_type"] = type(p).__name__
        out["typed_storage"] = torch.ones(2, device="cuda").storage().is_cuda
        ev = torch.Event(device="cuda")
        out["event"] = [ev.device.type, isinstance(ev, torch.Event)]
    """)
    assert out["nccl"] and out["pg"] and not out["map"]
    assert out["backend"] == ["hccl", "cpu:gloo,npu:hccl"]
    assert out["activity"] and out["profile"] and out["profile_type"] == "profile"
    assert out["typed_storage"] is True and out["event"] == ["npu", True]
