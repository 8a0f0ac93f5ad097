"""torch_npu.contrib.module.Prefetcher: the next batch copied to npu on a side stream."""
from __future__ import annotations

import torch


class Prefetcher:
    """``Prefetcher(loader)``: ``next()`` returns the current (input, target) on npu while the
    next pair is copied on ``stream`` (a torch.npu.Stream; one is made if None)."""

    def __init__(self, loader, stream=None):
        self.loader = iter(loader)
        self.stream = stream if stream is not None else torch.npu.Stream()
        self.preload()

    def preload(self) -> None:
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = self.next_target = None
            return
        with torch.npu.stream(self.stream):
            self.next_input = self.next_input.npu(non_blocking=True)
            self.next_target = self.next_target.npu(non_blocking=True)

    def next(self):
        torch.npu.current_stream().wait_stream(self.stream)
        item = self.next_input, self.next_target
        if self.next_target is not None:
            self.preload()
        return item
