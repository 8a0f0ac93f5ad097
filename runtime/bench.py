"""Runtime micro-benchmarks: ``python -m runtime.bench [--iters N]``.

Prints, in one run, medians (of batches of calls for the microsecond figures) of: empty-kernel enqueue-to-completion latency (and with the stream sanitizer on, and a kernel of one array argument with it off and on), event record +
synchronize, cached 1 MiB malloc+free against numpy.empty (and the cost of one empty Python call,
which says how fast the machine ran Python in those seconds), and H2D / D2H copy bandwidth against
numpy.copyto at 1 MiB and 64 MiB (the baseline is measured in the same run).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import runtime

MiB = 1 << 20

# The timed calls, compiled as a user's script: the runtime records the user's call site (file:line)
# of every malloc and enqueue, walking past its own frames, and this module is one of them. Calls
# made from here would walk up to runpy and measure that walk, not what a user's code pays.
_USER_CODE = """
def kernel_rt():
    runtime.launch(noop, stream=s)
    s.synchronize()

def array_kernel_rt():
    runtime.launch(noop1, arr, stream=s)
    s.synchronize()

def event_rt():
    ev.record(s)
    ev.synchronize()

def timing_event_rt():
    evt.record(s)
    evt.synchronize()

def malloc_free():
    runtime.free(runtime.malloc(MiB))

def numpy_empty():
    np.empty(MiB, np.uint8)

def python_calls():
    noop(); noop(); noop(); noop(); noop(); noop(); noop(); noop(); noop(); noop()

def h2d():
    runtime.memcpy(dev, host, size)

def d2h():
    runtime.memcpy(out, dev, size)

def copyto():
    np.copyto(ref, host)

def step_eager():
    for _ in range(16):
        runtime.launch(noop, stream=s)
    s.synchronize()

def step_graph():
    g.replay(s)
    s.synchronize()

def burst():
    for _ in range(1000):
        runtime.launch(noop, stream=s)
"""


def _user_functions(**env) -> dict:
    """The functions of _USER_CODE, as if defined in a script named <user code>."""
    ns = {"runtime": runtime, "np": np, "MiB": MiB, **env}
    exec(compile(_USER_CODE, "<user code>", "exec"), ns)
    return ns


def _median_us(fn, iters: int, warmup: int = 50, batch: int = 50) -> float:
    """Median over ``iters // batch`` batches of the mean time of one call in a batch.

    Batches keep the timer's own cost and the VM's scheduling jitter out of microsecond figures.
    """
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(max(iters // batch, 5)):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        ts.append((time.perf_counter() - t0) / batch)
    return statistics.median(ts) * 1e6


def _paired_median_us(fn, ref, iters: int, warmup: int = 5) -> tuple[float, float]:
    """Medians of ``fn`` and ``ref`` timed alternately, so both see the same machine state."""
    for _ in range(warmup):
        fn()
        ref()
    a, b = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        ref()
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return statistics.median(a) * 1e6, statistics.median(b) * 1e6


def _tasks_per_wakeup(s, u) -> float:
    """Tasks a stream's worker runs per wake-up when the host enqueues a burst faster than it
    runs them: its voluntary context switches (sleeps on the doorbell) over the burst."""
    import threading
    u["burst"]()
    s.synchronize()                     # the worker thread exists
    tid = next(t.native_id for t in threading.enumerate() if t.name.endswith(s.name))

    def switches() -> int:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    return int(line.split()[1])
        return 0
    ratios = []
    for _ in range(5):
        before = switches()
        u["burst"]()
        s.synchronize()
        ratios.append(1000 / max(1, switches() - before))
    return statistics.median(ratios)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    runtime.set_device(args.device)
    s = runtime.Stream()
    rows = []

    def noop():
        pass

    u = _user_functions(s=s, noop=noop, ev=runtime.Event(), evt=runtime.Event(enable_timing=True))
    rows.append(("empty kernel enqueue->completion", _median_us(u["kernel_rt"], args.iters), "us",
                 "target <= 30"))
    # the stream sanitizer (NPUSIM_STREAM_CHECK): off, a kernel pays one flag test; on, a
    # kernel with a device argument pays the check of its byte range (target: at most 3x off)
    was = runtime.stream_check_enabled()
    arr = runtime.zeros(256)
    ua = _user_functions(s=s, noop1=lambda x: None, arr=arr)
    runtime.enable_stream_check("off")
    t_off = _median_us(ua["array_kernel_rt"], args.iters)
    runtime.enable_stream_check("raise")
    t_empty_on = _median_us(u["kernel_rt"], args.iters)
    t_on = _median_us(ua["array_kernel_rt"], args.iters)
    runtime.enable_stream_check("raise" if was else "off")
    rows.append(("empty kernel enqueue->completion, stream check on", t_empty_on, "us",
                 "target <= 3x off"))
    rows.append(("1-array kernel enqueue->completion", t_off, "us", "stream check off"))
    rows.append(("1-array kernel enqueue->completion, check on", t_on, "us",
                 f"{t_on / t_off:.2f}x off (target <= 3x)"))
    arr.free()
    rows.append(("event record + synchronize", _median_us(u["event_rt"], args.iters), "us", ""))
    rows.append(("timing event record + synchronize", _median_us(u["timing_event_rt"], args.iters),
                 "us", ""))

    # a step of 16 small kernels, issued one by one and as a replayed graph
    g = runtime.Graph()
    with runtime.graph(g, stream=s):
        for _ in range(16):
            runtime.launch(noop, stream=s)
    u = _user_functions(s=s, noop=noop, g=g)
    t_eager = _median_us(u["step_eager"], args.iters // 4, batch=10)
    t_graph = _median_us(u["step_graph"], args.iters // 4, batch=10)
    rows.append(("step of 16 empty kernels, eager", t_eager, "us", ""))
    rows.append(("the same step, graph replay", t_graph, "us", f"{t_eager / t_graph:.1f}x faster"))
    rows.append(("burst of 1,000 kernels: tasks per worker wake-up", _tasks_per_wakeup(s, u),
                 "", "the worker drains its queue"))

    t_pool = _median_us(u["malloc_free"], args.iters * 5)
    t_np = _median_us(u["numpy_empty"], args.iters * 5)
    rows.append(("cached 1 MiB malloc+free", t_pool, "us", "target <= 10"))
    rows.append(("numpy.empty(1 MiB)", t_np, "us", "baseline"))
    # the VM's speed for Python code drifts by up to 2x over minutes here (other tenants): the
    # cost of one empty Python call, in the same seconds, says which state a run saw
    t_call = _median_us(u["python_calls"], args.iters * 5) * 100    # ns per call
    rows.append(("empty Python function call", t_call, "ns", "interpreter speed"))

    for size in (MiB, 64 * MiB):
        dev = runtime.malloc(size)
        c = _user_functions(dev=dev, size=size, host=np.ones(size, np.uint8),
                            out=np.empty(size, np.uint8), ref=np.empty(size, np.uint8))
        it = max(30, args.iters // (100 if size > MiB else 4))
        # each direction against the copyto timed alternately with it (the VM's speed drifts
        # between the two measurements; a baseline from the other one would skew the ratio)
        t_h2d, t_ref = _paired_median_us(c["h2d"], c["copyto"], it, warmup=20)
        t_d2h, t_ref2 = _paired_median_us(c["d2h"], c["copyto"], it, warmup=20)
        label = f"{size // MiB} MiB"
        gb = lambda t: size / t / 1e3  # noqa: E731 - bytes/us -> GB/s
        rows.append((f"H2D {label}", gb(t_h2d), "GB/s", f"{t_ref / t_h2d:.0%} of numpy.copyto"))
        rows.append((f"D2H {label}", gb(t_d2h), "GB/s", f"{t_ref2 / t_d2h:.0%} of numpy.copyto"))
        rows.append((f"numpy.copyto {label}", gb(min(t_ref, t_ref2)), "GB/s", "baseline"))
        runtime.free(dev)

    width = max(len(r[0]) for r in rows)
    print(f"{'metric':<{width}}  {'median':>10}  unit  note")
    for name, val, unit, note in rows:
        print(f"{name:<{width}}  {val:>10.2f}  {unit:<4}  {note}")
    runtime.reset_device()


if __name__ == "__main__":
    main()
