"""torch_npu.utils.profiler.Profile: ModelZoo's "profile one step" helper, on torch_npu.profiler.

``Profile(start_step=10, save_path=..., profile_type="ASCEND_PROFILER")``: ``start()`` /
``end()`` around each step; step ``start_step`` is recorded with torch_npu.profiler and written
by its ``tensorboard_trace_handler`` into ``save_path`` (npusim's trace and summary). With
``profile_type="TORCH"`` torch.autograd.profiler records the step; None disables it.
"""
from __future__ import annotations

import os

import torch

__all__ = ["Profile"]


class Profile:
    def __init__(self, start_step: int = 10, save_path: str = "./npu_profiling",
                 profile_type: str | None = None, use_npu: bool = True,
                 record_shape: bool = True, experimental_config=None, **kwargs):
        if profile_type not in (None, "TORCH", "ASCEND_PROFILER"):
            raise ValueError(f"profile_type must be None, 'TORCH' or 'ASCEND_PROFILER', got "
                             f"{profile_type!r}")
        self.start_step, self.save_path, self.profile_type = start_step, save_path, profile_type
        self.enable = profile_type is not None
        self.step_count = 0
        self._running = False
        self.prof = None
        if profile_type == "ASCEND_PROFILER":
            from torch_npu import profiler as tp
            self.prof = tp.profile(on_trace_ready=tp.tensorboard_trace_handler(save_path),
                                   experimental_config=experimental_config,
                                   record_shapes=record_shape, **kwargs)
        elif profile_type == "TORCH":
            self.prof = torch.autograd.profiler.profile(record_shapes=record_shape, **kwargs)
        if self.enable:
            os.makedirs(save_path, exist_ok=True)

    def start(self) -> None:
        if self._running:
            raise RuntimeError("start interface can only be called once before end")
        self._running = True
        if self.enable:
            self.step_count += 1
            if self.step_count == self.start_step:
                self.prof.__enter__()

    def end(self) -> None:
        if not self._running:
            raise RuntimeError("end interface must be called after start")
        self._running = False
        if self.enable and self.step_count == self.start_step:
            self.prof.__exit__(None, None, None)
            if self.profile_type == "TORCH":
                self.prof.export_chrome_trace(os.path.join(self.save_path, "torch_trace.json"))
