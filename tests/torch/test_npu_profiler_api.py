"""torch_npu.profiler on npusim's profiler (issue 51): torch_npu's API as MindSpeed and
torchtitan-npu use it, writing npusim's trace and summary."""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
torch_npu = pytest.importorskip("torch_npu")

from torch_npu import profiler as tp  # noqa: E402

A = tp.ProfilerAction


def _train(steps: int, prof=None):
    torch.npu.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4)).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32).npu(), torch.randn(16, 4).npu()
    for _ in range(steps):
        with torch.npu.mstx.annotate("forward"):
            loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if prof is not None:
            prof.step()
    return loss.item()


def test_schedule_actions():
    s = tp.schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=1)
    assert [s(i) for i in range(7)] == [A.NONE, A.NONE, A.WARMUP, A.RECORD,
                                        A.RECORD_AND_SAVE, A.NONE, A.NONE]
    s = tp.schedule(wait=2, active=1, skip_first_wait=1)
    assert [s(i) for i in range(4)] == [A.RECORD_AND_SAVE, A.NONE, A.NONE, A.RECORD_AND_SAVE]
    with pytest.raises(ValueError, match="active must be an int >= 1"):
        tp.schedule(wait=1, active=0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        s(-1)


def test_a_training_loop_gives_npusims_trace_and_summary(tmp_path):
    cfg = tp._ExperimentalConfig(profiler_level=tp.ProfilerLevel.Level1,
                                 aic_metrics=tp.AiCMetrics.PipeUtilization,
                                 export_type=[tp.ExportType.Text], l2_cache=False)
    with tp.profile(activities=[tp.ProfilerActivity.CPU, tp.ProfilerActivity.NPU],
                    schedule=tp.schedule(wait=1, warmup=1, active=3, repeat=1, skip_first=1),
                    on_trace_ready=tp.tensorboard_trace_handler(str(tmp_path), "w0"),
                    record_shapes=True, profile_memory=True, with_stack=True,
                    experimental_config=cfg) as prof:
        prof.add_metadata("run", "test")
        _train(8, prof)
    (cycle,) = os.listdir(tmp_path)
    assert cycle.startswith(f"w0_{os.getpid()}_") and cycle.endswith("_ascend_pt")
    d = tmp_path / cycle
    assert sorted(os.listdir(d)) == ["op_summary.csv", "profiler_metadata.json",
                                     "summary.json", "trace_rank0.json"]
    summary = json.loads((d / "summary.json").read_text())
    assert summary["steps"] == {"source": "marks", "common": 3}          # the 3 active steps
    (rank,) = summary["ranks"]
    assert rank["steps"] == 3 and len(rank["step_us"]) == 3
    assert abs(sum(rank["parts_us"].values()) - rank["step_mean_us"]) < 1e-3 * rank["step_mean_us"]
    # per step: 2 forward linears (addmm, whatever overload the device runs); 3 steps recorded
    assert sum(o["calls"] for o in summary["operators"]
               if o["name"].split(".")[0] == "aten::addmm") == 2 * 3
    trace = json.loads((d / "trace_rank0.json").read_text())["traceEvents"]
    spans = [e["name"] for e in trace if e.get("cat") == "range"]
    assert [s for s in spans if s.startswith("ProfilerStep#")] == \
        ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    assert spans.count("forward") == 3                                # mstx, active steps only
    assert any(e.get("ph") == "C" and e["name"].endswith("memory") for e in trace)
    assert prof.experimental_config._aic_metrics == tp.AiCMetrics.PipeUtilization
    assert json.loads((d / "profiler_metadata.json").read_text()) == {"run": "test"}
    with pytest.warns(UserWarning, match="Profiler is stopped"):
        prof.step()


def test_without_a_schedule_and_export_chrome_trace(tmp_path, monkeypatch):
    monkeypatch.delenv("ASCEND_WORK_PATH", raising=False)
    prof = tp.profile(activities=tp.supported_activities())
    prof.start()
    _train(2)
    prof.stop()
    out = tmp_path / "t.json"
    prof.export_chrome_trace(str(out))
    names = {e["name"].split(".")[0] for e in json.loads(out.read_text())["traceEvents"]}
    assert "aten::addmm" in names and "forward" in names
    assert tp.analyse(prof.prof_path)[-1].startswith("wrote ")


def test_repeated_cycles_write_a_directory_each(tmp_path):
    seen = []
    handler = tp.tensorboard_trace_handler(str(tmp_path), "w")
    with tp.profile(schedule=tp.schedule(wait=1, active=2, repeat=2),
                    on_trace_ready=handler) as p:
        p.on_trace_ready = lambda prof: (seen.append(prof.trace_path), handler(prof))
        _train(7, p)
    assert len(seen) == 2 and sorted(os.path.dirname(t) for t in seen) == \
        sorted(str(tmp_path / d) for d in os.listdir(tmp_path))
    for path in seen:
        with open(os.path.join(os.path.dirname(path), "summary.json")) as f:
            assert json.load(f)["steps"]["common"] == 2


def test_config_checks():
    assert tp.supported_export_type() == {"db", "text"}
    c = tp._ExperimentalConfig()                        # Level0: AI-core metrics reset to none
    assert c._aic_metrics == tp.AiCMetrics.AiCoreNone and c.export_type == ["text"]
    with pytest.raises(ValueError, match="profiler_level"):
        tp._ExperimentalConfig(profiler_level="Level9")
    with pytest.raises(ValueError, match="export_type"):
        tp._ExperimentalConfig(export_type="csv")
    with pytest.warns(UserWarning, match="reset it to text"):
        assert tp._ExperimentalConfig(export_type=None).export_type == ["text"]
    assert tp._ExperimentalConfig(export_type=[tp.ExportType.Db, tp.ExportType.Text]) \
        .export_type == ["db", "text"]
    with pytest.raises(TypeError, match="l2_cache must be a bool"):
        tp._ExperimentalConfig(l2_cache="yes")
    with pytest.raises(TypeError, match="ProfilerActivity"):
        tp.profile(activities=["npu"])
    with pytest.raises(TypeError, match="schedule must be callable"):
        tp.profile(schedule=3)


def test_torchtitan_npu_style_ascend_work_path(tmp_path, monkeypatch):
    """torchtitan-npu sets ASCEND_WORK_PATH and passes no on_trace_ready: the cycle's trace goes
    to ASCEND_WORK_PATH/profiling_data/<...>_ascend_pt."""
    monkeypatch.setenv("ASCEND_WORK_PATH", str(tmp_path))
    cfg = tp._ExperimentalConfig(profiler_level=tp.ProfilerLevel.Level1,
                                 aic_metrics=tp.AiCMetrics.ArithmeticUtilization)
    with tp.profile(activities=[tp.ProfilerActivity.CPU, tp.ProfilerActivity.NPU],
                    schedule=tp.schedule(wait=0, warmup=0, active=2, repeat=1), record_shapes=True,
                    experimental_config=cfg) as prof:
        _train(2, prof)
    (cycle,) = os.listdir(tmp_path / "profiling_data")
    assert cycle.endswith("_ascend_pt")
    assert os.listdir(tmp_path / "profiling_data" / cycle) == ["trace_rank0.json"]
    assert tp.analyse(str(tmp_path / "profiling_data" / cycle))[0].startswith("profile summary")
