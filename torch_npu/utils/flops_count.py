"""torch_npu.utils.FlopsCounter: the floating-point operations of the matrix operators run.

torch_npu counts in its C++ dispatcher; here torch's ``FlopCounterMode`` counts (mm, bmm,
addmm, convolution, attention: torch's formulas). ``get_flops()`` is ``[recorded, traversed]``:
flops counted while not paused, and all flops since ``start()``.
"""
from __future__ import annotations

from torch.utils.flop_counter import FlopCounterMode

from .._startstop import StartStop

__all__ = ["FlopsCounter"]


class FlopsCounter(StartStop):
    def __init__(self):
        self._mode = None
        self._recorded = 0
        self._traversed = 0
        self._paused = False
        self._mark = 0

    def _now(self) -> int:
        return self._mode.get_total_flops() if self._mode is not None else 0

    def start(self) -> None:
        if self._mode is not None:
            return
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()
        self._recorded = self._traversed = self._mark = 0
        self._paused = False

    def pause(self) -> None:
        if self._mode is not None and not self._paused:
            self._recorded += self._now() - self._mark
            self._paused = True

    def resume(self) -> None:
        if self._mode is not None and self._paused:
            self._mark = self._now()
            self._paused = False

    def get_flops(self) -> list:
        total = self._now()
        recorded = self._recorded + (0 if self._paused else total - self._mark)
        return [recorded, total]

    def stop(self) -> None:
        """Stop counting and reset the counts (as torch_npu's)."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
        self._mode = None
        self._recorded = self._traversed = self._mark = 0
