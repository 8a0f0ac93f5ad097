"""Benchmark of npusim's torch npu device against CPU eager (not a timed test).

    PYTHONPATH=. python benchmarks/npu_ops.py [--steps 10]

Prints microseconds per small operator (npu vs CPU), and one training step of a small
transformer (2 layers, width 128, batch 8, sequence 64; AdamW) on npu vs CPU, as medians.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch_npu  # noqa: F401


def per_op(dev: str, n: int = 2000) -> dict:
    a, b = torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)
    out = {}
    for name, f in (("add 64x64", lambda: a + b), ("mul_ in place", lambda: a.mul_(1.0)),
                    ("sum", lambda: a.sum()), ("matmul 64x64", lambda: a @ b)):
        for _ in range(50):
            f()
        t = time.perf_counter()
        for _ in range(n):
            f()
        if dev != "cpu":
            torch.npu.synchronize()
        out[name] = (time.perf_counter() - t) / n * 1e6
    return out


def model():
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def step_ms(dev: str, steps: int) -> float:
    torch.manual_seed(0)
    m = model().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(8, 64, 128).to(dev)
    times = []
    for _ in range(steps + 2):
        t = time.perf_counter()
        loss = m(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    cpu, npu = per_op("cpu"), per_op("npu")
    print(f"{'operator':<16} {'cpu us':>8} {'npu us':>8} {'ratio':>6}")
    for k in cpu:
        print(f"{k:<16} {cpu[k]:8.1f} {npu[k]:8.1f} {npu[k] / cpu[k]:6.1f}")
    c, n = step_ms("cpu", args.steps), step_ms("npu", args.steps)
    print(f"transformer step (2x128, batch 8, seq 64): cpu {c:.1f} ms, npu {n:.1f} ms, "
          f"ratio {n / c:.2f}")
    print("load:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
