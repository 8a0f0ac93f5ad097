"""torch_npu's surface beyond the device itself: every name of torch_npu.npu.__all__, the RNG,
legacy tensor types, device properties, set_stream, options, mstx, the Ascend environment,
named dtypes, torch_npu.distributed and ProcessGroupHCCL.Options (issue 51)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402
from runtime import profiler as rprof  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NotSupportedError = torch_npu.npu.utils.NotSupportedError


def _wheel_groups() -> dict:
    with open(os.path.join(ROOT, "benchmarks", "npu_coverage_wheel.json")) as f:
        return json.load(f)["groups"]


# ---------------------------------------------------------------------- every name
def test_every_name_of_torch_npu_npu_all_exists():
    names = [n[len("torch.npu."):] for n in _wheel_groups()["torch.npu"]
             if n.count(".") == 2]
    assert len(names) == 144                         # torch_npu 2.14.0's __all__
    assert [n for n in names if not hasattr(torch.npu, n)] == []
    assert sorted(torch.npu.__all__) == sorted(names)


def test_names_without_meaning_raise_saying_why():
    for name in ("super_kernel_scope_begin", "graph_task_group_begin", "stop_device", "MemPool",
                 "init_dump", "npurt", "stress_detect"):
        with pytest.raises(NotSupportedError, match=f"{name} is not supported by npusim: "):
            getattr(torch.npu, name)()
    assert isinstance(NotSupportedError("x"), NotImplementedError)


# ---------------------------------------------------------------------- RNG
def test_rng_state_all_round_trip_and_default_generators():
    n = runtime.device_count()
    assert torch.npu.random is sys.modules["torch_npu.npu.random"]
    assert len(torch.npu.default_generators) == n
    torch.npu.set_device(0)
    torch.npu.manual_seed_all(7)
    states = torch.npu.get_rng_state_all()
    assert len(states) == n and all(s.dtype == torch.uint8 for s in states)
    a = torch.randn(5, device="npu:1").cpu()
    torch.npu.random.set_rng_state_all(states)
    b = torch.randn(5, device="npu:1").cpu()
    assert torch.equal(a, b)
    # the generator tuple is what npu random operators draw from (DeepSpeed's checkpointing)
    g = torch.npu.default_generators[0]
    g.manual_seed(11)
    x = torch.rand(4, device="npu:0").cpu()
    assert torch.equal(x, torch.rand(4, generator=torch.Generator().manual_seed(11)))
    assert torch.equal(torch.npu.get_rng_state(0), g.get_state())
    with pytest.raises(TypeError, match="new_state must be a torch.Tensor"):
        torch.npu.set_rng_state([1, 2])
    with pytest.raises(ValueError, match="new_states has"):
        torch.npu.set_rng_state_all([states[0]] * (n + 1))


def test_lazy_call_runs_now():
    seen = []
    torch.npu._lazy_call(lambda: seen.append(1))
    torch.npu._lazy_call(lambda: seen.append(2), seed_all=True)
    assert seen == [1, 2] and torch.npu.is_initialized()


# ---------------------------------------------------------------------- legacy types
def test_legacy_tensor_types_as_deepspeed_uses_them():
    torch.npu.set_device(0)
    t = torch.npu.FloatTensor([0.5])
    assert t.device == torch.device("npu", 0) and t.dtype == torch.float32
    assert t.tolist() == [0.5]
    assert isinstance(t, torch.npu.FloatTensor) and not isinstance(t, torch.npu.HalfTensor)
    assert not isinstance(torch.ones(1), torch.npu.FloatTensor)        # a CPU tensor
    assert isinstance(torch.ones(2, device="npu").long(), torch.npu.LongTensor)
    assert torch.npu.LongTensor(3, 2).shape == (3, 2)                  # sizes
    assert torch.npu.BFloat16Tensor([1.0]).dtype == torch.bfloat16
    assert t.type() == "torch.npu.FloatTensor"
    with pytest.raises(TypeError, match="takes no device"):
        torch.npu.FloatTensor([1.0], device="npu")
    with pytest.raises(RuntimeError, match="typed npu storages are not supported"):
        torch.npu.FloatStorage(4)


# ---------------------------------------------------------------------- the card
def test_device_properties_as_an_ascend_card(monkeypatch):
    p = torch.npu.get_device_properties(0)
    assert p.name == "Ascend910B1" == torch.npu.get_device_name()
    assert p.total_memory == torch.npu.mem_get_info(0)[1]
    assert (p.cube_core_num, p.vector_core_num) == (24, 48)
    assert "Ascend910B1" in repr(p)
    monkeypatch.delenv("TORCH_NPU_DEVICE_CAPABILITY", raising=False)
    with pytest.warns(UserWarning, match="TORCH_NPU_DEVICE_CAPABILITY"):
        assert torch.npu.get_device_capability() is None          # as torch_npu answers
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "8.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cap = torch.npu.get_device_capability(0)
    assert cap == (8, 0) and cap.major == 8 and cap.minor == 0
    assert torch.npu.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.npu.can_device_access_peer(0, 1)


def test_ascend_environment_set_on_import():
    code = ("import os, torch, torch_npu; print(torch.version.cann); "
            "print(os.environ['ASCEND_HOME_PATH']); print(os.environ['ASCEND_TOOLKIT_HOME'])")
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    cann, home, toolkit = r.stdout.split()
    assert cann == torch.version.cann == torch.npu.utils.get_cann_version() == "9.0.0"
    assert home == toolkit == os.path.join(ROOT, "torch_npu", "_ascend_home")
    assert os.path.isdir(home)
    env["ASCEND_HOME_PATH"] = "/opt/mine"                  # a user's value is kept
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.stdout.split()[1] == "/opt/mine"


# ---------------------------------------------------------------------- streams
def test_set_stream_makes_work_run_on_it():
    torch.npu.set_device(0)
    default = torch.npu.current_stream()
    s = torch.npu.Stream()
    torch.npu.set_stream(s)
    try:
        assert torch.npu.current_stream() == s
        x = torch.arange(4.0, device="npu") * 2
        assert x.tolist() == [0.0, 2.0, 4.0, 6.0]
        with torch.npu.stream(default):                    # a block inside: its own stream
            assert torch.npu.current_stream() == default
        assert torch.npu.current_stream() == s
    finally:
        torch.npu.set_stream(default)
    assert torch.npu.current_stream() == default
    torch.npu.set_stream(None)                              # None: no change, as torch's
    with torch.npu.StreamContext(s) as got:
        assert got is s and torch.npu.current_stream() == s


# ---------------------------------------------------------------------- options
def test_options_are_recorded_and_read_back():
    torch.npu.matmul.allow_hf32 = True
    assert torch.npu.matmul.allow_hf32 is True
    torch.npu.matmul.allow_hf32 = False
    assert torch.npu.matmul.allow_hf32 is False
    torch.npu.matmul.cube_math_type = torch.npu.CubeMathType.USE_HF32
    assert torch.npu.matmul.cube_math_type == torch.npu.CubeMathType.USE_HF32
    with pytest.raises(TypeError, match="allow_hf32 must be a bool"):
        torch.npu.conv.allow_hf32 = 1
    with torch.npu.aclnn.flags(allow_hf32=False):
        assert torch.npu.aclnn.allow_hf32 is False and torch.npu.conv.allow_hf32 is False
    torch.npu.aclnn.allow_hf32 = True
    assert torch.npu.conv.allow_hf32 is True
    torch.npu.set_compile_mode(jit_compile=False)
    assert torch.npu.is_jit_compile_false()
    torch.npu.config.allow_internal_format = False
    assert torch.npu.config.allow_internal_format is False
    torch.npu.set_task_queue_enable(2)
    assert torch.npu.get_task_queue_enable() == 2
    with pytest.raises(RuntimeError, match="mode must be 0, 1, or 2"):
        torch.npu.set_task_queue_enable(5)
    torch.npu.set_sync_debug_mode("warn")
    assert torch.npu.get_sync_debug_mode() == 1
    torch.npu.set_sync_debug_mode(0)
    s = torch.npu.Stream(0)
    assert torch.npu.get_stream_limit(s) == {"cube_core_num": 24, "vector_core_num": 48}
    torch.npu.set_stream_limit(s, 12, 24)
    assert torch.npu.get_stream_limit(s) == {"cube_core_num": 12, "vector_core_num": 24}
    torch.npu.reset_stream_limit(s)
    assert torch.npu.get_stream_limit(s)["cube_core_num"] == 24
    with pytest.raises(ValueError, match="cube_num must be"):
        torch.npu.set_stream_limit(s, 99)
    assert torch.npu.get_allocator_backend() == "native"
    assert not torch.npu.is_current_stream_capturing()


def test_overflow_checks_as_on_a_910b():
    assert torch.npu.utils.is_support_inf_nan()
    assert torch.npu.utils.npu_check_overflow(torch.tensor([1.0, float("inf")], device="npu"))
    assert not torch.npu.utils.npu_check_overflow(torch.ones(3, device="npu"))
    assert torch.npu.utils.npu_check_overflow(float("nan"))
    with pytest.raises(RuntimeError, match="soc_version >= Ascend910B1"):
        torch.npu.get_npu_overflow_flag()
    assert torch.npu.utils._is_gte_cann_version("8.5.0")
    assert torch.npu.utils._is_gte_cann_version("8.2.RC1")
    assert not torch.npu.utils._is_gte_cann_version("9.1.0")


def test_memory_names():
    torch.npu.set_device(0)
    x = torch.empty(1 << 20, device="npu")
    assert torch.npu.memory_cached() == torch.npu.memory_reserved() > 0
    nested = torch.npu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == \
        torch.npu.memory_stats()["allocated_bytes.all.current"]
    assert torch.npu.get_per_process_memory_fraction() == 1.0
    del x
    before = torch.npu.memory_allocated(0)
    ptr = torch.npu.caching_allocator_alloc(1 << 16, 0)
    assert isinstance(ptr, int) and torch.npu.memory_allocated(0) >= before + (1 << 16)
    torch.npu.caching_allocator_delete(ptr)
    assert torch.npu.memory_allocated(0) == before
    with pytest.raises(ValueError, match="was not allocated"):
        torch.npu.caching_allocator_delete(ptr)
    assert torch.npu.current_blas_handle() is None


# ---------------------------------------------------------------------- mstx
def test_mstx_ranges_and_marks_land_in_the_trace(tmp_path):
    mstx = torch.npu.mstx
    path = str(tmp_path / "trace_rank0.json")
    with runtime.profile(path):
        rid = mstx.range_start("load")
        torch.ones(4, device="npu").sum().item()
        mstx.range_end(rid)
        mstx.mark("here", domain="mine")
        mstx.range_push("outer")
        with mstx.annotate("inner"):
            pass
        assert mstx.range_pop() == 0

        @mstx.mstx_range("decorated")
        def f():
            return 3
        assert f() == 3
    with open(path) as fh:
        ev = json.load(fh)["traceEvents"]
    spans = {e["name"]: e for e in ev if e.get("cat") in ("range", "mark")}
    assert {"load", "here", "outer", "inner", "decorated"} <= set(spans)
    assert spans["here"]["cat"] == "mark" and spans["here"]["args"] == {"domain": "mine"}
    assert spans["outer"]["ts"] <= spans["inner"]["ts"]
    assert spans["outer"]["ts"] + spans["outer"]["dur"] >= \
        spans["inner"]["ts"] + spans["inner"]["dur"]
    assert all(e["tid"] == rprof.HOST_TRACK for e in spans.values())
    with pytest.warns(UserWarning, match="no range pushed"):
        assert mstx.range_pop() == -1
    with pytest.warns(UserWarning, match="Invalid message"):
        assert mstx.range_start("") == 0


# ---------------------------------------------------------------------- dtypes
def test_named_dtypes():
    from torch_npu import dtypes
    assert (int(torch_npu.hifloat8), int(torch_npu.float8_e4m3fn), int(torch_npu.int4)) == \
        (290, 292, 285)
    assert dtypes.compute_dtype(torch_npu.float8_e4m3fn) is torch.float8_e4m3fn
    assert dtypes.storage_dtype(torch_npu.hifloat8) is torch.uint8
    with pytest.raises(NotSupportedError, match="torch_npu.hifloat8 is not supported"):
        dtypes.compute_dtype(torch_npu.hifloat8, "x1_dtype")
    with pytest.raises(TypeError, match="expected a torch_npu dtype"):
        dtypes.storage_dtype("fp8")


# ---------------------------------------------------------------------- distributed
def _dist_rank(rank: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch_npu

    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    out = {}
    opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    opts.hccl_config = {"hccl_buffer_size": 2, "group_name": "tp"}
    g = dist.new_group([0, 1], pg_options=opts)
    out["config"] = g.hccl_config
    out["slice"] = g.comm._knobs[1]
    t = torch.full((3,), float(rank + 1), device="npu")
    dist.all_reduce(t, group=g)
    out["sum"] = t.tolist()
    # uneven reduce-scatter: rank 0 gets 1 row, rank 1 gets 3
    x = torch.arange(8.0, device="npu").reshape(4, 2) * (rank + 1)
    y = torch.empty((1, 2) if rank == 0 else (3, 2), device="npu")
    torch_npu.distributed.reduce_scatter_tensor_uneven(y, x, [1, 3])
    out["rs"] = y.tolist()
    # uneven all-gather: rank 0 gives 1 row, rank 1 gives 2
    z = torch.full((rank + 1, 2), float(rank), device="npu")
    o = torch.empty(3, 2, device="npu")
    w = torch_npu.distributed.all_gather_into_tensor_uneven(o, z, [1, 2], async_op=True)
    w.wait()
    out["ag"] = o.tolist()
    # all_to_all_vc: rank 0 sends 1 to 0 and 2 to 1; rank 1 sends 3 to 0 and 1 to 1
    m = [[1, 2], [3, 1]]
    send = torch.arange(float(sum(m[rank])), device="npu") + 10 * rank
    recv = torch.empty(m[0][rank] + m[1][rank], device="npu")
    torch_npu.distributed.all_to_all_vc(recv, send, m)
    out["a2a"] = recv.tolist()
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(240)
def test_distributed_names_and_hccl_options():
    import launcher
    from torch_npu.distributed import is_hccl_available, reinit_process_group
    assert is_hccl_available()
    with pytest.raises(NotSupportedError, match="reinit_process_group"):
        reinit_process_group()
    r0, r1 = launcher.spawn(_dist_rank, 2, timeout=200)
    for r in (r0, r1):
        assert r["config"] == {"hccl_buffer_size": 2, "group_name": "tp"}
        assert r["slice"] == 2 << 20               # hccl_buffer_size MB is the group's slice
        assert r["sum"] == [3.0, 3.0, 3.0]
        assert r["ag"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    full = [[0.0, 3.0], [6.0, 9.0], [12.0, 15.0], [18.0, 21.0]]   # x * (1 + 2)
    assert r0["rs"] == full[:1] and r1["rs"] == full[1:]
    assert r0["a2a"] == [0.0, 10.0, 11.0, 12.0]    # its own 1 element, then rank 1's 3
    assert r1["a2a"] == [1.0, 2.0, 13.0]           # rank 0's 2 elements, then its own 1


# ---------------------------------------------------------------------- utils and contrib
def test_combine_tensors_and_flops():
    from torch_npu.utils import (FlopsCounter, get_part_combined_tensor,
                                 is_combined_tensor_valid, npu_combine_tensors)
    torch.npu.set_device(0)
    a = torch.nn.Parameter(torch.arange(4.0, device="npu"))
    b = torch.ones(2, 3, device="npu")
    c = npu_combine_tensors([a, b])
    assert c.tolist() == [0.0, 1.0, 2.0, 3.0] + [1.0] * 6
    assert is_combined_tensor_valid(c, [a, b])
    c.mul_(2)                                                  # a and b are views of c
    assert a.tolist() == [0.0, 2.0, 4.0, 6.0] and b.sum().item() == 12.0
    assert get_part_combined_tensor(c, 4, 6).tolist() == [2.0] * 6
    with pytest.raises(RuntimeError, match="must be on NPU"):
        npu_combine_tensors([torch.ones(2)])
    fc = FlopsCounter()
    fc.start()
    torch.ones(8, 16, device="npu") @ torch.ones(16, 4, device="npu")      # 2*8*16*4 flops
    fc.pause()
    torch.ones(8, 16, device="npu") @ torch.ones(16, 4, device="npu")
    fc.resume()
    assert fc.get_flops() == [1024, 2048]
    fc.stop()


def test_contrib_helpers():
    from torch_npu import contrib
    b1 = torch.tensor([[0.0, 0.0, 2.0, 2.0]], device="npu")
    b2 = torch.tensor([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 2.0, 2.0]], device="npu")
    iou = contrib.npu_iou(b1, b2, mode="iou")
    assert iou.shape == (1, 2)
    assert torch.allclose(iou.cpu(), torch.tensor([[1.001 / 7.001, 1.0]]))
    x = torch.arange(6.0, device="npu")
    contrib.npu_fast_condition_index_put(x, x > 3, 0.0)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0]
    flags = contrib.npu_single_level_responsible_flags(
        (2, 3), torch.tensor([[16.0, 0.0, 24.0, 8.0]]), (8, 8), 2)    # centre (20, 4): cell (0, 2)
    assert flags.tolist() == [0, 0, 0, 0, 1, 1] + [0] * 6
    bn = contrib.FastBatchNorm2d(3)
    assert isinstance(bn, torch.nn.BatchNorm2d)
    loader = [(torch.full((2,), float(i)), torch.tensor([i])) for i in range(3)]
    p = contrib.Prefetcher(loader)
    got = []
    while True:
        inp, tgt = p.next()
        if inp is None:
            break
        got.append((inp.device.type, tgt.item()))
    assert got == [("npu", 0), ("npu", 1), ("npu", 2)]
    with pytest.raises(NotSupportedError, match="ModulatedDeformConv is not supported"):
        contrib.ModulatedDeformConv(3, 3, 3)


def test_more_torch_npu_names():
    with pytest.raises(NotSupportedError, match="torch_npu.HiFloat8Tensor is not supported"):
        torch_npu.HiFloat8Tensor()
    from torch_npu._op_gaps import GAPS
    for name in GAPS:
        assert callable(getattr(torch_npu, name))
    if "npu_hans_encode" not in dir(torch_npu.fused):
        with pytest.raises(NotSupportedError, match="torch_npu.npu_hans_encode is not supported"):
            torch_npu.npu_hans_encode(torch.ones(2))
    assert torch_npu._ShardedGradScaler()._device == "npu"
    import torch_npu.npu._recovery as rec
    with pytest.raises(NotSupportedError, match="_recovery.update_npu_tensor_to_safe"):
        rec.update_npu_tensor_to_safe(torch.ones(1))
    assert torch_npu.utils.collect_env.get_cann_version() == torch.version.cann
    allowed = os.sched_getaffinity(0)
    core = min(allowed)
    torch_npu.utils.set_thread_affinity([core, core])
    try:
        assert os.sched_getaffinity(0) == {core}
    finally:
        torch_npu.utils.reset_thread_affinity()
    assert os.sched_getaffinity(0) == allowed


@pytest.mark.timeout(300)
def test_deepspeeds_npu_accelerator_without_ascend_home():
    """DeepSpeed 0.19.8's NPU accelerator and op builder in a fresh interpreter with no
    ASCEND_HOME_PATH: they died on a KeyError before import torch_npu set it."""
    pytest.importorskip("deepspeed")
    code = """
import json, warnings
warnings.simplefilter("ignore")
import torch, torch_npu
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.op_builder.npu.builder import NPUOpBuilder
acc = get_accelerator()
t = acc.FloatTensor([0.0])
calls = []
acc.lazy_call(lambda: calls.append(1))
print("RESULT", json.dumps({
    "name": type(acc).__name__, "backend": acc.communication_backend_name(),
    "float": [str(t.device), isinstance(t, acc.FloatTensor)],
    "total": acc.total_memory(0) == torch.npu.get_device_properties(0).total_memory,
    "gen": acc.default_generator(0) is torch.npu.default_generators[0], "lazy": calls,
    "cann": NPUOpBuilder.installed_cann_path(None)}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert out["name"] == "NPU_Accelerator" and out["backend"] == "hccl"
    assert out["float"] == ["npu:0", True] and out["total"] and out["gen"]
    assert out["lazy"] == [1]
    assert out["cann"] == os.path.join(ROOT, "torch_npu", "_ascend_home")


def test_the_rest_of_torch_npu_as_a_script_calls_it(tmp_path):
    """The torch.npu names no test above reaches, each called as a script would call it."""
    npu = torch.npu
    npu.init()
    npu.set_device(0)
    npu.random.manual_seed(3)
    npu.random.manual_seed_all(3)
    assert npu.initial_seed() == npu.random.initial_seed() == 3
    npu.seed()
    npu.random.seed()
    npu.seed_all()
    npu.random.seed_all()
    s = npu.initial_seed()
    assert all(g.initial_seed() == s for g in npu.default_generators)
    t = torch.ones(2, device="npu:1")
    with npu.device_of(t):
        assert npu.current_device() == 1
    with npu.utils.device_of(torch.ones(1)):                # a CPU tensor: no change
        assert npu.utils.current_device() == 0
    with npu.utils.device(1):
        assert npu.utils.current_device() == 1
    assert npu.utilization(0) == 0
    npu.empty_cache()                       # what earlier tests of this process still hold
    held = npu.memory_reserved()
    x = torch.empty(1 << 20, device="npu")
    assert npu.max_memory_cached() >= npu.memory_cached() > 0
    snap = npu.memory_snapshot()
    assert snap and snap[0]["device"] == 0
    npu.reset_max_memory_allocated()
    npu.reset_max_memory_cached()
    assert npu.max_memory_allocated() == npu.memory_allocated()
    del x
    npu.empty_virt_addr_cache()
    assert npu.memory_reserved() == held
    npu.set_aoe(str(tmp_path / "aoe"))
    assert os.path.isdir(tmp_path / "aoe") and npu.get_option("autotune") == "enable"
    npu.set_mm_bmm_format_nd(False)
    assert npu.get_mm_bmm_format_nd() is False
    npu.set_mm_bmm_format_nd(True)
    with pytest.warns(UserWarning, match="useless"):
        npu.clear_npu_overflow_flag()
    with pytest.warns(UserWarning, match="useless"):
        npu.utils.clear_npu_overflow_flag()
    with pytest.raises(RuntimeError, match="Ascend910B1"):
        npu.utils.get_npu_overflow_flag()
    assert not npu.utils.is_force_overflow_check()
    assert npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert npu.is_bf16_supported() and npu.utils.is_bf16_supported()
    npu.set_autocast_dtype(torch.bfloat16)
    npu.set_autocast_enabled(True)
    assert npu.is_autocast_enabled() and npu.get_autocast_dtype() == torch.bfloat16
    npu.set_autocast_enabled(False)
    npu.set_autocast_dtype(torch.float16)
    assert not npu.is_autocast_enabled()

    class Twice(torch.autograd.Function):
        @staticmethod
        @npu.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, a):
            return a * 2

        @staticmethod
        @npu.amp.custom_bwd
        def backward(ctx, g):
            return g * 2
    a = torch.ones(2, device="npu", requires_grad=True)
    with torch.autocast("npu", dtype=torch.bfloat16):
        y = Twice.apply(a.bfloat16())
    assert y.dtype == torch.float32
    y.sum().backward()
    assert a.grad.tolist() == [2.0, 2.0]
    for name, dtype in (("BoolTensor", torch.bool), ("ByteTensor", torch.uint8),
                        ("CharTensor", torch.int8), ("DoubleTensor", torch.float64),
                        ("IntTensor", torch.int32), ("ShortTensor", torch.int16)):
        v = getattr(npu, name)([1, 0])
        assert v.dtype == dtype and v.device.type == "npu" and isinstance(v, getattr(npu, name))
    for name in ("BoolStorage", "ByteStorage", "ShortStorage", "LongStorage", "IntStorage",
                 "HalfStorage", "CharStorage", "DoubleStorage", "BFloat16Storage"):
        with pytest.raises(RuntimeError, match=f"torch.npu.{name}: typed npu storages"):
            getattr(npu, name)()
    assert npu.check_uce_in_memory(0) == 0 == npu.utils.check_uce_in_memory(0)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        b = npu.enable_deterministic_with_backward(torch.ones(1))
        assert torch.are_deterministic_algorithms_enabled() and b.tolist() == [1.0]
        npu.disable_deterministic_with_backward(b)
        assert not torch.are_deterministic_algorithms_enabled()
        npu.set_deterministic_level(1)
        assert torch.are_deterministic_algorithms_enabled()
        npu.set_deterministic_level(0)
        assert not torch.are_deterministic_algorithms_enabled()
        with pytest.raises(ValueError, match="level must be an int"):
            npu.set_deterministic_level(-1)
    finally:
        torch.use_deterministic_algorithms(before)
    assert npu.get_device_limit(0) == {"cube_core_num": 24, "vector_core_num": 48}
    npu.set_device_limit(1, cube_num=8)                    # torch_npu allows one call
    assert npu.get_device_limit(1) == {"cube_core_num": 8, "vector_core_num": 48}
    with pytest.raises(RuntimeError, match="already been called"):
        npu.set_device_limit(1, vector_num=8)
    npu.ipc_collect()
    npu.utils.ipc_collect()
    npu.set_op_timeout_ms(500)
    npu.utils.set_op_timeout_ms(600)
    assert npu.get_option("OP_TIMEOUT_MS") == "600"
    with pytest.raises(ValueError, match="timeout_ms"):
        npu.set_op_timeout_ms(-1)
    npu.host_empty_cache()
    npu.use_compatible_impl(True)
    assert npu.are_compatible_impl_enabled()
    npu.use_compatible_impl(False)
    assert not npu.are_compatible_impl_enabled()
    npu.utils.set_task_queue_enable(1)
    assert npu.utils.get_task_queue_enable() == 1
    npu.utils.set_sync_debug_mode("default")
    assert npu.utils.get_sync_debug_mode() == 0
    assert npu.utils.current_blas_handle() is None
    npu.utils.set_device(0)
    npu.utils.synchronize()
    s2 = npu.utils.current_stream()
    assert s2 == npu.utils.default_stream()
    side = npu.Stream()
    with npu.utils.stream(side):
        assert npu.utils.current_stream() == side
    with npu.utils.StreamContext(None):
        assert npu.utils.current_stream() == s2
    npu.utils.set_stream(side)
    npu.utils.set_stream(s2)
    with pytest.warns(UserWarning, match="version isn't implemented"):
        assert npu.aclnn.version() is None
    assert npu.aclnn.set_flags(False) == (True,) and npu.aclnn.allow_hf32 is False
    npu.aclnn.set_flags(True)
