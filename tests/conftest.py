"""Shared fixtures: a fresh simulated device per test, and leak checks; tests that need torch.

Tests that need torch carry the ``needs_torch`` marker: given explicitly, or added here to every
test of a module that calls ``pytest.importorskip("torch...")`` at its top level and to every test
function that calls it in its body. Without torch they are skipped, saying why; with it,
``python -m pytest -m needs_torch`` runs exactly them (.ci/run does, after the run without torch).
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

NO_TORCH_REASON = ("torch is not installed: install its CPU build to run this test "
                   "(docs/torch.md: pip install torch --index-url "
                   "https://download.pytorch.org/whl/cpu)")


def _real_torch() -> bool:
    """True when torch itself is installed. pytest puts tests/ on sys.path (it holds this conftest
    and no __init__.py), so without torch ``import torch`` would find tests/torch/ as an empty
    namespace package: find_spec says "found" and ``importorskip("torch")`` passes."""
    spec = importlib.util.find_spec("torch")
    return spec is not None and spec.origin not in (None, "namespace")


TORCH = _real_torch()

# Each pytest session has simulated cards of its own (runtime/memory/card.py: the processes that share
# NPUSIM_CARD_DIR share each device's HBM), so that runs side by side on one machine never see
# each other's memory; the processes a test starts inherit it.
# Named by the session's pid: a session that was killed leaves its directory, which the next
# session removes once no process has that pid.
if not os.environ.get("NPUSIM_CARD_DIR"):
    import atexit
    import shutil
    import tempfile
    _cards = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    for _old in os.listdir(_cards):
        _pid = _old.rpartition(".")[2]
        if _old.startswith("npusim.cards.pytest.") and _pid.isdigit() and \
                not os.path.exists(f"/proc/{_pid}"):
            shutil.rmtree(os.path.join(_cards, _old), True)
    os.environ["NPUSIM_CARD_DIR"] = os.path.join(_cards, f"npusim.cards.pytest.{os.getpid()}")
    atexit.register(shutil.rmtree, os.environ["NPUSIM_CARD_DIR"], True)
if not TORCH:
    # Make ``import torch`` fail in this process as it would anywhere else, so that every
    # ``pytest.importorskip("torch")`` skips instead of importing tests/torch/ (see above).
    sys.modules["torch"] = None


def torch_missing() -> str:
    """Why a test that needs torch cannot run here, or "" when torch is installed."""
    return "" if TORCH else NO_TORCH_REASON


# ``pytest.importorskip("torch")`` or ``torch = pytest.importorskip("torch", ...)`` at a
# module's top level (the second form was missed: its modules never ran in CI's torch run)
_TOP_LEVEL_SKIP = re.compile(r"^(?:\w+\s*=\s*)?pytest\.importorskip\(\s*['\"]torch", re.M)
_ANY_SKIP = re.compile(r"importorskip\(\s*['\"]torch")


@functools.lru_cache(maxsize=None)
def _module_needs_torch(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return bool(_TOP_LEVEL_SKIP.search(f.read()))
    except OSError:
        return False


def _function_needs_torch(fn) -> bool:
    try:
        return bool(_ANY_SKIP.search(inspect.getsource(fn)))
    except (OSError, TypeError):
        return False


@pytest.hookimpl(tryfirst=True)   # before -m selects: `-m needs_torch` sees the added marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        fn = getattr(item, "function", None)
        if item.get_closest_marker("needs_torch") is None and (
                _module_needs_torch(str(item.path)) or (fn is not None and _function_needs_torch(fn))):
            item.add_marker(pytest.mark.needs_torch)
        if not TORCH and item.get_closest_marker("needs_torch") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_TORCH_REASON))


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
