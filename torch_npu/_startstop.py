"""``StartStop``: ``with x:`` for an object that has ``start()`` and ``stop()``."""
from __future__ import annotations


class StartStop:
    """A context manager over ``start()`` and ``stop()``: entering starts the object and returns
    it, leaving stops it, an exception or not (and lets the exception through)."""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
