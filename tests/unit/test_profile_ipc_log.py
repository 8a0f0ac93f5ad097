"""Profiling (Chrome trace per stream), device memory reachable from another process, logging."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import runtime

pytestmark = pytest.mark.timeout(60)


def test_profile_writes_one_track_per_stream_with_x_events(device, tmp_path):
    path = tmp_path / "trace.json"
    a, b = runtime.Stream(), runtime.Stream()
    x = runtime.zeros(1 << 16, np.float32)
    with runtime.profile(str(path)):
        runtime.launch(lambda v: time.sleep(0.02), x, stream=a, name="my_kernel")
        runtime.memcpy_async(x, np.ones(1 << 16, np.float32), x.nbytes, stream=b)
        ev = runtime.Event(enable_timing=True)
        ev.record(b)
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    names = {e["name"]: e for e in xs}
    assert "my_kernel" in names and names["my_kernel"]["dur"] >= 15000      # microseconds
    assert names["my_kernel"]["tid"] == a.id and names["my_kernel"]["cat"] == "kernel"
    copy = [e for e in xs if e["cat"] == "copy"]
    assert copy and copy[0]["tid"] == b.id and copy[0]["args"]["bytes"] == x.nbytes
    assert any(e["cat"] == "event" for e in xs)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert a.id in tracks and b.id in tracks and tracks[a.id] != tracks[b.id]


def test_profile_dir_env(tmp_path):
    code = ("import runtime, numpy as np\n"
            "runtime.set_device(0)\n"
            "runtime.launch(np.sum, runtime.zeros(10), name='k1')\n"
            "runtime.synchronize()\n")
    env = dict(os.environ, NPUSIM_PROFILE_DIR=str(tmp_path), RANK="3",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    data = json.loads((tmp_path / "trace_rank3.json").read_text())
    assert any(e.get("name") == "k1" and e["ph"] == "X" and e["pid"] == 3 for e in data["traceEvents"])


def test_device_memory_is_reachable_from_another_process(device):
    """The memfd behind a device can be mapped by another process of the node (shared-memory
    data path); the kernel frees it with the last process, so nothing is ever left behind."""
    from runtime.context import current_context
    p = runtime.malloc(4096)
    runtime.memcpy(p, np.arange(16, dtype=np.uint8), 16)
    mem = current_context().memory
    off = p.addr - mem.base
    code = (f"import mmap, os\nfd = os.open({mem.ipc_handle()!r}, os.O_RDWR)\n"
            f"m = mmap.mmap(fd, {off + 4096}, mmap.MAP_SHARED)\n"
            f"print(list(m[{off}:{off + 16}]))\nm[{off}] = 99\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == list(range(16))
    back = np.empty(1, np.uint8)
    runtime.memcpy(back, p, 1)
    assert back[0] == 99
    # a memfd, not a named file: nothing in /dev/shm to leave behind (checked without listing
    # /dev/shm, which other jobs on the machine may be using)
    assert os.readlink(mem.ipc_handle()).startswith("/memfd:npusim-")
    runtime.free(p)


@pytest.mark.parametrize("level,shown", [("0", True), ("3", False)])
def test_log_level_from_environment(level, shown):
    code = ("import runtime, numpy as np\nruntime.set_device(0)\n"
            "s = runtime.Stream()\nruntime.launch(lambda: 1/0, stream=s, name='bad')\n"
            "import logging; logging.getLogger('runtime.stream').warning('warned')\n"
            "try:\n    s.synchronize()\nexcept runtime.errors.TaskError:\n    pass\n")
    env = dict(os.environ, ASCEND_GLOBAL_LOG_LEVEL=level,
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert ("warned" in out.stderr) == shown
    assert "task bad" in out.stderr          # errors are always logged at the default level


def test_profile_blocks_nest_inside_the_env_recording(tmp_path):
    code = ("import runtime, numpy as np\n"
            "runtime.set_device(0)\n"
            "runtime.launch(np.sum, runtime.zeros(10), name='before'); runtime.synchronize()\n"
            f"with runtime.profile({str(tmp_path / 'block.json')!r}):\n"
            "    runtime.launch(np.sum, runtime.zeros(10), name='inside')\n"
            "runtime.launch(np.sum, runtime.zeros(10), name='after'); runtime.synchronize()\n")
    env = dict(os.environ, NPUSIM_PROFILE_DIR=str(tmp_path / "env"), RANK="0",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    names = lambda p: {e["name"] for e in json.loads(p.read_text())["traceEvents"] if e["ph"] == "X"}  # noqa: E731
    assert "inside" in names(tmp_path / "block.json")
    assert not {"before", "after"} & names(tmp_path / "block.json")
    assert {"before", "inside", "after"} <= names(tmp_path / "env" / "trace_rank0.json")
