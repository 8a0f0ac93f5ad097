"""Run a test body on a fresh thread (tests of the npu device).

The device a thread is bound to, its current stream and its autograd mode are per thread: a test
that binds a device runs its body through ``on_thread`` so that the pytest thread is left as it
was. Shared by tests/torch/test_lib_step_costs.py and tests/torch/test_npu_device_index.py.
"""
from __future__ import annotations

import threading


def on_thread(fn, timeout: float = 120, name: str | None = None):
    """Run ``fn`` on a new thread (named ``name``, by default after ``fn``) and return what it
    returned; re-raise what it raised. Bounded by ``timeout`` seconds."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e
    t = threading.Thread(target=run, name=name or f"on-thread-{fn.__name__}")
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn.__name__} did not finish in {timeout} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")
