"""torch_npu.profiler on npusim's profiler: torch_npu's API, npusim's trace and summary.

``with torch_npu.profiler.profile(activities=..., schedule=schedule(wait=1, warmup=1, active=3),
on_trace_ready=tensorboard_trace_handler(DIR)) as prof: ... prof.step()`` runs as in MindSpeed
and torchtitan-npu. What a recording is: npusim's trace of every task of every stream
(runtime/profiler.py, docs/profiling.md), not msprof's; what is written for each active cycle of
the schedule: a directory ``DIR/<worker>_<pid>_<time>_ascend_pt`` (torch_npu's naming) holding
the process's trace ``trace_rank<N>.json`` (N: the rank, else 0; open it in Perfetto) and, from
the handler (``analyse_flag=True``), the summary of launcher.profile.summary (``summary.json``,
``op_summary.csv``: steps, the compute / transfer / copy / wait / host split, the operator
table). Each active step is one step of that summary: ``prof.step()`` marks step boundaries
(``runtime.profiler.step``) and spans ``ProfilerStep#N`` on the host track when a schedule is
given, as torch_npu's record_function does.

Accepted and kept, with no effect on what npusim records (it has no msprof): activities (CPU
and NPU tasks are both in npusim's trace), ``record_shapes``, ``profile_memory`` (the trace always
has the memory counters), ``with_stack``, ``with_flops``, ``with_modules``, and
``_ExperimentalConfig``'s level, AI-core metrics, L2 cache and export type (``ExportType.Db``
writes the same JSON: npusim has no database export).
"""
from __future__ import annotations

import enum
import os
import shutil
import socket
import tempfile
import warnings
from datetime import datetime, timezone
from typing import Callable, Iterable, Optional

from runtime import profiler as _prof

from .._startstop import StartStop
from .config import (AiCMetrics, ExportType, HostSystem, ProfilerLevel, _ExperimentalConfig,
                     supported_ai_core_metrics, supported_export_type, supported_profiler_level)
from .scheduler import ProfilerAction, Schedule, _default_schedule_fn

schedule = Schedule

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler",
           "schedule", "ProfilerAction", "_ExperimentalConfig", "supported_profiler_level",
           "supported_ai_core_metrics", "supported_export_type", "ProfilerLevel", "AiCMetrics",
           "ExportType", "HostSystem"]


class ProfilerActivity(enum.Enum):
    """What to record: host (CPU) and device (NPU) activity; npusim's trace always has both."""
    CPU = 0
    NPU = 1


def supported_activities() -> set:
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


def _rank() -> int:
    from runtime import config
    r = config.rank()
    return 0 if r is None else r


class _TraceHandler:
    """What ``tensorboard_trace_handler`` returns: where the cycles go, and the summary step."""

    def __init__(self, dir_name, worker_name, analyse_flag: bool):
        self.dir_name, self.worker_name, self.analyse_flag = dir_name, worker_name, analyse_flag

    def new_dir(self) -> str:
        base = self.dir_name
        if base is None:
            work = os.environ.get("ASCEND_WORK_PATH")
            base = os.path.join(work, "profiling_data") if work else os.getcwd()
        now = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
        span = f"{self.worker_name or socket.gethostname()}_{os.getpid()}_{now}_ascend_pt"
        path = os.path.join(os.path.abspath(base), span)
        n = 1
        while os.path.exists(path):          # two cycles within a millisecond
            path = os.path.join(os.path.abspath(base), f"{span[:-len('_ascend_pt')]}-{n}_ascend_pt")
            n += 1
        os.makedirs(path)
        return path

    def __call__(self, prof: "profile") -> None:
        if self.analyse_flag and prof.prof_path:
            analyse(prof.prof_path)


def tensorboard_trace_handler(dir_name: Optional[str] = None, worker_name: Optional[str] = None,
                              analyse_flag: bool = True, async_mode: bool = False):
    """``on_trace_ready``: each cycle's trace in ``dir_name/<worker>_<pid>_<time>_ascend_pt``
    (``dir_name`` None: ASCEND_WORK_PATH/profiling_data, else the working directory), and its
    summary when ``analyse_flag`` (``async_mode`` is accepted; the summary is written at once)."""
    if dir_name is not None and not isinstance(dir_name, (str, os.PathLike)):
        raise TypeError(f"tensorboard_trace_handler: dir_name must be a path, got "
                        f"{type(dir_name).__name__}")
    if worker_name is not None and not isinstance(worker_name, str):
        raise TypeError(f"tensorboard_trace_handler: worker_name must be a str, got "
                        f"{type(worker_name).__name__}")
    return _TraceHandler(None if dir_name is None else os.fspath(dir_name), worker_name,
                         bool(analyse_flag))


def analyse(profiler_path: str, max_process_number: int = 1, export_type=None) -> list[str]:
    """Write the summary (``summary.json``, ``op_summary.csv``) of the traces in
    ``profiler_path`` there; returns the summary's console lines."""
    from launcher.profile.summary import summarize_dir
    return summarize_dir(profiler_path)


class _KinetoProfile:
    """The recording half of ``profile``: start, stop, export."""

    def __init__(self, *, activities: Optional[Iterable[ProfilerActivity]] = None,
                 record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False, with_modules: bool = False,
                 experimental_config: Optional[_ExperimentalConfig] = None,
                 custom_trace_id_callback: Optional[Callable[[], str]] = None):
        acts = set(activities) if activities else supported_activities()
        for a in acts:
            if not isinstance(a, ProfilerActivity):
                raise TypeError(f"activities: expected torch_npu.profiler.ProfilerActivity "
                                f"members, got {a!r}")
        if experimental_config is not None and \
                not isinstance(experimental_config, _ExperimentalConfig):
            raise TypeError("experimental_config must be a torch_npu.profiler._ExperimentalConfig"
                            f", got {type(experimental_config).__name__}")
        self.activities = acts
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.with_stack, self.with_flops, self.with_modules = with_stack, with_flops, with_modules
        self.experimental_config = experimental_config or _ExperimentalConfig()
        self.custom_trace_id_callback = custom_trace_id_callback
        self.metadata: dict = {}
        self.prof_path: Optional[str] = None          # the directory of the last cycle
        self.trace_path: Optional[str] = None         # its trace file
        self._sink = None
        self._dir_of = None                           # () -> a new cycle directory

    def _start_trace(self) -> None:
        if self._sink is not None:
            return
        self.prof_path = self._dir_of() if self._dir_of else tempfile.mkdtemp(prefix="npusim_prof_")
        self.trace_path = os.path.join(self.prof_path, f"trace_rank{_rank()}.json")
        self._sink = _prof.start()
        _prof.step()                                  # the boundary before the first active step

    def _stop_trace(self) -> None:
        sink, self._sink = self._sink, None
        if sink is None:
            return
        from runtime.context import synchronize_all
        try:
            synchronize_all()
        finally:
            _prof.stop_and_write(sink, self.trace_path)
        if self.metadata:
            import json
            with open(os.path.join(self.prof_path, "profiler_metadata.json"), "w") as f:
                json.dump(self.metadata, f, indent=1)

    def start(self) -> None:
        self._start_trace()

    def stop(self) -> None:
        self._stop_trace()

    @property
    def recording(self) -> bool:
        return self._sink is not None

    def add_metadata(self, key: str, value: str) -> None:
        """Kept in ``profiler_metadata.json`` beside the trace, as torch_npu's."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("add_metadata: key and value must be str")
        self.metadata[key] = value

    def add_metadata_json(self, key: str, value: str) -> None:
        import json
        json.loads(value)                             # a clear error on bad JSON
        self.add_metadata(key, value)

    def export_chrome_trace(self, output_path: str) -> None:
        """Copy the last cycle's trace (Chrome / Perfetto JSON) to ``output_path``."""
        if not self.trace_path or not os.path.exists(self.trace_path):
            raise RuntimeError("export_chrome_trace: no trace recorded yet (the profiler has not "
                               "finished an active cycle)")
        shutil.copyfile(self.trace_path, output_path)

    def export_stacks(self, output_path: str, metric: str = "self_cpu_time_total") -> None:
        raise NotImplementedError("export_stacks is not supported by npusim's profiler: its "
                                  "trace keeps each task's call site (args.site), not stacks")

    def export_memory_timeline(self, output_path: str, device: Optional[str] = None) -> None:
        raise NotImplementedError("export_memory_timeline is not supported by npusim's profiler: "
                                  "the trace has the memory counters (NPU<d> memory)")


class profile(StartStop, _KinetoProfile):
    """torch_npu.profiler.profile over npusim's recording (module docstring)."""

    def __init__(self, *, activities: Optional[Iterable[ProfilerActivity]] = None,
                 schedule: Optional[Callable[[int], ProfilerAction]] = None,
                 on_trace_ready: Optional[Callable] = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False,
                 with_flops: bool = False, with_modules: bool = False,
                 experimental_config: Optional[_ExperimentalConfig] = None,
                 execution_trace_observer=None,
                 custom_trace_id_callback: Optional[Callable[[], str]] = None,
                 use_cuda: Optional[bool] = None):
        super().__init__(activities=activities, record_shapes=record_shapes,
                         profile_memory=profile_memory, with_stack=with_stack,
                         with_flops=with_flops, with_modules=with_modules,
                         experimental_config=experimental_config,
                         custom_trace_id_callback=custom_trace_id_callback)
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be callable (torch_npu.profiler.schedule(...)), got "
                            f"{type(schedule).__name__}")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"on_trace_ready must be callable, got {type(on_trace_ready).__name__}")
        self.schedule = schedule or _default_schedule_fn
        self.record_steps = schedule is not None
        self.on_trace_ready = on_trace_ready
        if isinstance(on_trace_ready, _TraceHandler):
            self._dir_of = on_trace_ready.new_dir
        elif os.environ.get("ASCEND_WORK_PATH"):
            self._dir_of = _TraceHandler(None, None, False).new_dir
        self.execution_trace_observer = execution_trace_observer
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self.stopped = True
        self._step_t0 = None

    def _step_span(self, begin: bool) -> None:
        if not self.record_steps:
            return
        if self._step_t0 is not None and _prof.on:
            _prof.record(_prof.HOST_TRACK, f"ProfilerStep#{self.step_num}", "range",
                         self._step_t0, _prof.now_us())
        self._step_t0 = _prof.now_us() if begin else None

    def _transit(self, prev, cur) -> None:
        """torch_npu's action table: a cycle's trace is written when RECORD_AND_SAVE ends (or
        the profiler stops while recording), and handed to on_trace_ready."""
        rec = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        if prev == ProfilerAction.RECORD_AND_SAVE or \
                (prev == ProfilerAction.RECORD and cur is None):
            self._stop_trace()
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)
        elif prev == ProfilerAction.RECORD and cur not in rec:
            warnings.warn(f"Incorrect schedule: RECORD followed by {cur.name}")
            self._stop_trace()
        if cur in rec:
            self._start_trace()

    def start(self) -> None:
        self.stopped = False
        self._transit(ProfilerAction.NONE, self.current_action)
        self._step_span(begin=True)

    def stop(self) -> None:
        if self.stopped:
            return
        self._step_span(begin=False)
        self._transit(self.current_action, None)
        self.stopped = True

    def step(self) -> None:
        """End the current step (a step boundary in npusim's trace) and follow the schedule."""
        if self.stopped:
            warnings.warn("Profiler is stopped, step takes no effect!")
            return
        self._step_span(begin=False)
        if self.recording:
            _prof.step()
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transit(prev, self.current_action)
        self._step_span(begin=True)

    def __del__(self):
        try:
            if not self.stopped and self.recording:
                self.stop()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
