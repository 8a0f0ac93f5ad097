"""runtime's core is one device contract: it imports none of its observers (the profiler, the
stream sanitizer, graph capture), which attach through runtime/hooks.py while they observe; the
memory room's old module paths are the moved modules (issue 55)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import runtime
from runtime import errors, hooks
from test_layers import import_graph

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORE = ("runtime.current", "runtime.context", "runtime.stream", "runtime.event", "runtime.array",
        "runtime.kernels")
OBSERVERS = {"runtime.profiler", "runtime.sanitizer", "runtime.graph"}


def reach(graph: dict, start: str) -> set:
    """Every module ``start`` imports, directly or not (imports inside functions counted)."""
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def test_the_core_reaches_no_observer_even_inside_functions():
    graph = import_graph("runtime", inside_functions=True)
    core = [m for m in graph if m in CORE or m.startswith("runtime.memory")]
    assert len(core) > 12                         # the memory room's modules are in it
    bad = {m: sorted(reach(graph, m) & OBSERVERS) for m in core if reach(graph, m) & OBSERVERS}
    assert bad == {}
    assert reach(graph, "runtime.hooks") == set()
    # the observers import the core (the arrows are real)
    assert "runtime.current" in reach(graph, "runtime.graph")
    assert {"runtime.array", "runtime.hooks"} <= reach(graph, "runtime.sanitizer")
    assert "runtime.context" in reach(graph, "runtime.profiler")


def test_the_stream_check_attaches_while_it_is_on(device):
    assert hooks.stream_check is None and not runtime.stream_check_enabled()
    runtime.enable_stream_check("raise")
    try:
        from runtime import sanitizer
        assert hooks.stream_check is sanitizer and sanitizer.on
        a = runtime.zeros(16)
        s = runtime.Stream()
        runtime.launch(lambda x: None, a, stream=s)
        with pytest.raises(errors.StreamRaceError):      # the core called the check
            runtime.launch(lambda x: None, a)
        s.synchronize()
        a.free()
        s.destroy()
    finally:
        runtime.enable_stream_check("off")
    assert hooks.stream_check is None


def test_the_profiler_attaches_while_it_records(device, tmp_path):
    assert hooks.profiler is None
    path = tmp_path / "t.json"
    with runtime.profile(str(path)):
        from runtime import profiler
        assert hooks.profiler is profiler
        s = runtime.Stream(name="hooked")
        a = runtime.zeros(4, stream=s)
        s.synchronize()
    assert hooks.profiler is None
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert "NPU0 hooked" in names                # hooks.stream_created named the track
    assert [e["name"] for e in events if e.get("cat") == "copy"] == ["zeros"]
    a.free()
    s.destroy()


def test_a_capture_attaches_while_it_runs(device):
    assert hooks.capture is None
    s = runtime.Stream()
    a = runtime.zeros(8)
    g = runtime.Graph()
    with runtime.graph(g, stream=s):
        from runtime import graph
        assert hooks.capture is graph
        runtime.launch(lambda x: np.add(x, 1, out=x), a, stream=s)
        with pytest.raises(errors.GraphCaptureError):     # the core asked the capture
            runtime.malloc(64)
    assert hooks.capture is None
    g.replay(s)
    s.synchronize()
    assert a.to_host().tolist() == [1.0] * 8
    a.free()
    s.destroy()


def test_set_current_stream_replaces_the_top_of_the_stack(device):
    s1, s2 = runtime.Stream(), runtime.Stream()
    with runtime.stream(s1):
        runtime.context.set_current_stream(s2)
        assert runtime.current_stream() is s2
    assert runtime.current_stream() is runtime.default_stream()
    with pytest.raises(errors.InvalidParamError, match="expected a runtime.Stream"):
        runtime.context.set_current_stream("s")
    s1.destroy()
    s2.destroy()


def test_the_memory_fraction_reads_back(device):
    assert runtime.memory.get_per_process_memory_fraction() == 1.0
    runtime.set_per_process_memory_fraction(0.5)
    try:
        assert runtime.memory.get_per_process_memory_fraction(0) == 0.5
    finally:
        runtime.set_per_process_memory_fraction(1.0)


@pytest.mark.timeout(120)
def test_old_memory_paths_are_the_moved_modules():
    code = ("import importlib, sys, runtime\n"
            "for name in ['pool', 'pool_args', 'blocks', 'free_lists', 'front_cache', 'stats',\n"
            "             'device_memory', 'card', 'ipc']:\n"
            "    m = importlib.import_module('runtime.' + name)\n"
            "    new = 'runtime.memory.' + name\n"
            "    assert m is sys.modules[new] and m.__name__ == m.__spec__.name == new, name\n"
            "from runtime.pool import CachingAllocator, MemMallocPolicy\n"
            "from runtime.memory import DevicePtr, malloc, memcpy, MemMallocPolicy as P\n"
            "assert P is MemMallocPolicy and runtime.MemMallocPolicy is P\n"
            "assert DevicePtr.__module__ == 'runtime.memory.pointers'\n"
            "assert runtime.card is sys.modules['runtime.memory.card']\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_importing_the_pool_does_not_load_the_memory_api():
    code = ("import sys, runtime.memory.pool\n"
            "print(sorted(m for m in sys.modules if m.startswith('runtime.memory.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=100)
    assert out.returncode == 0, out.stderr
    assert "runtime.memory.pool" in out.stdout and "alloc" not in out.stdout \
        and "pointers" not in out.stdout
