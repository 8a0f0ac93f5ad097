"""Shared fixtures: a fresh simulated device per test, and leak checks."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def device(monkeypatch):
    """Device 0 with 1 GiB of capacity, reset (and leak-checked by the test) afterwards."""
    import runtime
    monkeypatch.setenv("NPUSIM_HBM_BYTES", str(1 << 30))
    runtime.set_device(0)
    yield 0
    try:
        runtime.reset_device(0)
    except Exception:
        pass
