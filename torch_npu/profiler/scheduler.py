"""torch_npu.profiler.schedule: which steps are waited, warmed up, recorded and saved."""
from __future__ import annotations

import enum

__all__ = ["ProfilerAction", "Schedule"]


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class Schedule:
    """``schedule(wait, active, warmup=0, repeat=0, skip_first=0, skip_first_wait=0)``:
    skip ``skip_first`` steps, then cycles of ``wait`` steps idle, ``warmup`` steps warming up
    and ``active`` steps recorded, the last of them saved (RECORD_AND_SAVE); ``repeat`` cycles
    (0: until the profiler stops). ``skip_first_wait`` skips the first cycle's wait. Bad
    arguments raise ValueError (torch_npu resets them to defaults with a warning)."""

    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0,
                 skip_first: int = 0, skip_first_wait: int = 0):
        for name, v, least in (("wait", wait, 0), ("active", active, 1), ("warmup", warmup, 0),
                               ("repeat", repeat, 0), ("skip_first", skip_first, 0),
                               ("skip_first_wait", skip_first_wait, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError(f"schedule: {name} must be an int >= {least}, got {v!r}")
        self.wait, self.active, self.warmup = wait, active, warmup
        self.repeat, self.skip_first, self.skip_first_wait = repeat, skip_first, skip_first_wait

    def __call__(self, step: int) -> ProfilerAction:
        if step < 0:
            raise ValueError(f"schedule: step must be >= 0, got {step}")
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait:
            step += self.wait
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step // cycle >= self.repeat:
            return ProfilerAction.NONE
        m = step % cycle
        if m < self.wait:
            return ProfilerAction.NONE
        if m < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if m < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    def __repr__(self):
        return (f"schedule(wait={self.wait}, warmup={self.warmup}, active={self.active}, "
                f"repeat={self.repeat}, skip_first={self.skip_first})")


def _default_schedule_fn(_: int) -> ProfilerAction:
    """Without a schedule: record from start() to stop()."""
    return ProfilerAction.RECORD
