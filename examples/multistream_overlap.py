"""Overlap host-to-device copies with compute on two streams, ordered by events.

    python examples/multistream_overlap.py

A stream of data arrives in chunks in pinned host memory (``runtime.malloc_host``). Each chunk
is copied to the device (``memcpy_async`` HOST_TO_DEVICE) and then processed by a kernel. Done
on one stream, every copy waits for the previous kernel and every kernel for its copy. Done on
two streams, chunk k's kernel on the compute stream waits (``wait_event``) only for an event
recorded after chunk k's copy on the copy stream, so the copy of chunk k+1 runs while chunk k
is processed: the way a real NPU's DMA engine and AI cores work side by side.

Both schedules do the same work on the same buffers and their results are compared. Times come
from timing events (``runtime.Event(enable_timing=True)``); the best of ``--repeat`` runs of each
is reported. The kernels are numpy ufuncs, which release the GIL, so the two streams' worker
threads really run at the same time on two cores.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import runtime

DTYPE = np.float32


def process(x, y, passes):
    """The compute kernel: ``passes`` square roots, y = x ** (1 / 2**passes), one ufunc each."""
    np.sqrt(x, out=y)
    for _ in range(passes - 1):
        np.sqrt(y, out=y)


class Pipeline:
    """Pinned host chunks, their device copies and outputs, and the two schedules."""

    def __init__(self, chunks: int, chunk_bytes: int, passes: int, seed: int):
        n = chunk_bytes // np.dtype(DTYPE).itemsize
        self.nbytes = n * np.dtype(DTYPE).itemsize
        self.passes = passes
        rng = np.random.default_rng(seed)
        self.host = []
        for _ in range(chunks):
            h = runtime.malloc_host(self.nbytes)
            h.view(DTYPE)[:] = rng.random(n, dtype=DTYPE)
            self.host.append(h)
        self.dev_in = [runtime.empty(n, DTYPE) for _ in range(chunks)]
        self.dev_out = [runtime.empty(n, DTYPE) for _ in range(chunks)]
        self.compute = runtime.Stream()
        self.copy = runtime.Stream()

    def run(self, overlap: bool) -> float:
        """Enqueue every copy and kernel, wait, and return the elapsed milliseconds."""
        cs = self.compute
        ks = self.copy if overlap else cs
        start, end = runtime.Event(enable_timing=True), runtime.Event(enable_timing=True)
        start.record(cs)
        if overlap:
            ks.wait_event(start)          # no copy starts before the clock does
        for k, (h, d, out) in enumerate(zip(self.host, self.dev_in, self.dev_out)):
            runtime.memcpy_async(d, h, self.nbytes, runtime.MemcpyKind.HOST_TO_DEVICE, stream=ks)
            if overlap:
                cs.wait_event(ks.record_event())       # kernel k waits for copy k only
            runtime.launch(process, d, out, self.passes, stream=cs, name=f"process_chunk{k}")
        end.record(cs)
        end.synchronize()
        return start.elapsed_time(end)

    def results(self) -> list[np.ndarray]:
        return [a.to_host(stream=self.compute) for a in self.dev_out]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=32, help="chunks of data (default 32)")
    p.add_argument("--chunk-mb", type=float, default=4.0, help="MB per chunk (default 4)")
    p.add_argument("--passes", type=int, default=1,
                   help="square-root passes of the kernel over its chunk: compute per byte copied "
                        "(default 1, about the time of the copy)")
    p.add_argument("--repeat", type=int, default=10,
                   help="timed runs of each schedule (default 10)")
    p.add_argument("--device", type=int, default=int(os.environ.get("LOCAL_RANK", 0)),
                   help="NPU to use (default LOCAL_RANK or 0)")
    args = p.parse_args(argv)
    if min(args.chunks, args.passes, args.repeat) < 1 or args.chunk_mb <= 0:
        p.error("--chunks, --passes, --repeat and --chunk-mb must be positive")

    runtime.set_device(args.device)
    pipe = Pipeline(args.chunks, int(args.chunk_mb * 2**20), args.passes, seed=0)
    print(f"{args.chunks} chunks x {pipe.nbytes / 2**20:g} MiB: memcpy_async HOST_TO_DEVICE from "
          f"pinned memory, then a kernel of {args.passes} sqrt pass(es) per chunk", flush=True)
    pipe.run(overlap=False)                  # warm-up: first touch of every page
    reference = pipe.results()
    pipe.run(overlap=True)
    serial, overlapped = [], []
    for _ in range(args.repeat):             # interleaved, so both see the same machine load
        serial.append(pipe.run(overlap=False))
        overlapped.append(pipe.run(overlap=True))
    same = all(np.array_equal(a, b) for a, b in zip(reference, pipe.results()))
    s, o = min(serial), min(overlapped)
    print(f"one stream (copy, kernel, copy, kernel, ...): {s:8.1f} ms", flush=True)
    print(f"copy stream + compute stream with events:     {o:8.1f} ms", flush=True)
    print(f"speed-up: {s / o:.2f}x (best of {args.repeat} runs each; results "
          f"{'identical' if same else 'DIFFER'})", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
