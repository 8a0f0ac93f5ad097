"""``os`` for examples/checkpoint.py that SIGKILLs the process partway through a write.

The helper's module attribute ``os`` is swapped for ``KillingOs(budget)``: every byte written
and every fsync, rename and unlink spends one unit, and the call that finds the budget spent
kills the process with SIGKILL (no cleanup, as a real crash), so a test can cut a checkpoint
write at any byte or between any two of its steps without changing the helper.
"""
from __future__ import annotations

import os
import signal


class KillingOs:
    """Forwards to ``os``; SIGKILLs this process once ``budget`` units are spent."""

    def __init__(self, budget: int, say: str = ""):
        self.budget, self.say = budget, say

    def __getattr__(self, name):
        return getattr(os, name)

    def _spend(self, n: int) -> int:
        if self.budget <= 0:
            if self.say:
                print(self.say, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        take = min(n, self.budget)
        self.budget -= take
        return take

    def write(self, fd, data):
        return os.write(fd, bytes(data[:self._spend(len(data))]))

    def fsync(self, fd):
        self._spend(1)
        os.fsync(fd)

    def replace(self, src, dst):
        self._spend(1)
        os.replace(src, dst)

    def unlink(self, path):
        self._spend(1)
        os.unlink(path)
