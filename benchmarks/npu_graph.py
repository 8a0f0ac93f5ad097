"""NPUGraph replay against eager npu code and CPU eager (a benchmark, not a timed test; issue 52).

    PYTHONPATH=. python benchmarks/npu_graph.py [--rounds 7] [--iters 200] [--threads 1]
                                                [--batch 16] [--width 256] [--layers 4] [--ddp]

Times the forward of an MLP (``--layers`` Linear+ReLU of ``--width``, batch ``--batch``, no grad)
three ways in one process: eager on npu, the same forward captured once with
``torch.npu.graph`` and replayed with ``NPUGraph.replay()`` (followed by one
``torch.npu.synchronize()`` per round, so the replays' work is in the figure), and eager on CPU.
Also one training step (forward, backward, SGD with momentum) eager on npu against its replay,
and with ``--ddp`` a DDP(model) step at world 2 (two ranks by launcher.spawn, each timed alone).
Every figure is microseconds of the process's CPU time per call (``time.process_time``: every
thread of the process, not what other programs take), the best of ``--rounds`` rounds, the
three measured one after the other within each round so a change of load hits all of them.
The replay's output is checked bitwise against eager's first.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch_npu  # noqa: F401


def _mlp(width: int, layers: int, dev: str):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(width, 10)).to(dev)


def _time(fn, iters: int, sync) -> float:
    fn()
    sync()
    t = time.process_time()
    for _ in range(iters):
        fn()
    sync()
    return (time.process_time() - t) / iters * 1e6


def _eager_and_replay(step, warm: int, rounds: int, iters: int) -> dict:
    """``step`` run ``warm`` times, captured once in an NPUGraph, then the best of ``rounds``
    of its eager and replayed time per call (``_time``), and the graph's node count."""
    for _ in range(warm):
        step()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        step()
    best = {"eager": float("inf"), "replay": float("inf")}
    sync = torch.npu.synchronize
    for _ in range(rounds):
        best["eager"] = min(best["eager"], _time(step, iters, sync))
        best["replay"] = min(best["replay"], _time(g.replay, iters, sync))
    best["nodes"] = len(g)
    return best


def forward(args) -> dict:
    m, mc = _mlp(args.width, args.layers, "npu"), _mlp(args.width, args.layers, "cpu")
    xc = torch.randn(args.batch, args.width)
    x = xc.to("npu")
    with torch.no_grad():
        ref = m(x).cpu()
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            out = m(x)
        g.replay()
        if not torch.equal(out.cpu(), ref):
            raise SystemExit("the replay's output differs from eager's")
        best = {"eager": float("inf"), "replay": float("inf"), "cpu": float("inf")}
        sync = torch.npu.synchronize
        for _ in range(args.rounds):
            best["eager"] = min(best["eager"], _time(lambda: m(x), args.iters, sync))
            best["replay"] = min(best["replay"], _time(g.replay, args.iters, sync))
            best["cpu"] = min(best["cpu"], _time(lambda: mc(xc), args.iters, lambda: None))
    best["nodes"] = len(g)
    return best


def train_step(args) -> dict:
    m = _mlp(args.width, args.layers, "npu")
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(args.batch, args.width).to("npu")
    y = torch.randn(args.batch, 10).to("npu")

    def step():
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        return loss
    return _eager_and_replay(step, 2, args.rounds, max(args.iters // 4, 10))


def ddp_rank(rank: int, width: int, batch: int, rounds: int, iters: int) -> dict:
    """One rank of a DDP(model) step (forward, backward with the buckets' all_reduces, SGD),
    eager against its replay; world 2 (``--ddp``)."""
    import warnings

    import torch.distributed as dist
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    m = _mlp(width, 2, f"npu:{rank}")
    ddp = torch.nn.parallel.DistributedDataParallel(m, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(batch, width).to(f"npu:{rank}")
    y = torch.randn(batch, 10).to(f"npu:{rank}")

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    best = _eager_and_replay(step, 3, rounds, iters)
    dist.destroy_process_group()
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ddp", action="store_true", help="also a DDP step at world 2 (two ranks)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    f = forward(args)
    print(f"MLP forward ({args.layers}x Linear+ReLU, width {args.width}, batch {args.batch}; "
          f"{f['nodes']} graph nodes), us of process CPU time per call, best of {args.rounds}:")
    print(f"  npu eager   {f['eager']:9.1f}")
    print(f"  npu replay  {f['replay']:9.1f}   eager / replay = {f['eager'] / f['replay']:.2f}x")
    print(f"  CPU eager   {f['cpu']:9.1f}   replay / CPU = {f['replay'] / f['cpu']:.2f}x")
    t = train_step(args)
    print(f"training step (forward, backward, SGD; {t['nodes']} graph nodes):")
    print(f"  npu eager   {t['eager']:9.1f}")
    print(f"  npu replay  {t['replay']:9.1f}   eager / replay = {t['eager'] / t['replay']:.2f}x")
    if args.ddp:
        import functools

        import launcher
        rows = launcher.spawn(functools.partial(ddp_rank, width=args.width, batch=args.batch,
                                                rounds=args.rounds, iters=max(args.iters // 8, 5)),
                              2, timeout=600)
        print(f"DDP(model) step at world 2 (forward, backward + bucket all_reduce, SGD; "
              f"{rows[0]['nodes']} graph nodes), per rank:")
        for r, d in enumerate(rows):
            print(f"  rank {r}: eager {d['eager']:9.1f}  replay {d['replay']:9.1f}   "
                  f"eager / replay = {d['eager'] / d['replay']:.2f}x")


if __name__ == "__main__":
    main()
