"""A torch model trained with DistributedDataParallel on npusim's "hccl" backend (torch_npu's name).

Run it with the launcher (rank 0 prints the progress and the summary):

    npurun --nproc-per-node 4 examples/train_torch_ddp.py
    npurun --nproc-per-node 4 examples/train_torch_ddp.py --check
    npurun --nproc-per-node 4 examples/train_torch_ddp.py --check --backend gloo
    npurun --nproc-per-node 4 --max-restarts 3 examples/train_torch_ddp.py --checkpoint-dir /tmp/ckpt
    npurun --nproc-per-node 2 examples/train_torch_ddp.py --device npu --check
    torchrun --standalone --nproc-per-node 2 examples/train_torch_ddp.py --backend gloo

``--device npu`` trains on npusim's torch ``npu`` device, as a torch_npu script does: ``import
torch_npu``, ``torch.npu.set_device(local_rank)``, the model ``.to(f"npu:{local_rank}")``,
``DistributedDataParallel(model, device_ids=[local_rank])``; the "hccl" backend then reduces the
gradients in the npu tensors' own device memory. ``--reload-every K`` round-trips the model and
the optimizer through ``torch.save`` / ``torch.load`` every K steps on every rank (alternately
without ``map_location`` and with ``map_location=f"npu:{local_rank}"``, or ``"cpu"`` on CPU) and
trains on from what was loaded. ``--print-losses`` prints every rank's loss of every step, exactly
(``float.hex``): the same script on CPU with gloo under torchrun prints the same bits
(tests/torch/test_torch_npu_ddp.py).

The training code is what a torch_npu script runs: ``dist.init_process_group(backend="hccl")``,
``DistributedDataParallel(model)``, an optimizer, ``loss.backward()``. The one npusim-specific
line is ``import hccl.torch_backend`` (where torch_npu scripts ``import torch_npu``): it registers
the backend, whose collectives (DDP's start-up parameter broadcast, its bucketed gradient
all_reduce) run on npusim communicators and streams, with npusim's hang diagnosis. Under npurun
it also serves torch's ``env://`` rendezvous from npusim's job store, which is why
``--backend gloo`` (torch's own CPU backend, for comparison) needs it too.

``--check`` verifies at the end that every replica holds bitwise-identical parameters (an
all_gather of their digests) and that they match, within 1e-6 relative, the same model trained
in the rank-0 process over the full global batches without torch.distributed; the exit code is
1 if not. Parameters are float64 so the data-parallel run and the reference agree to far better
than 1e-6 although they sum the gradients in different orders.

``--checkpoint-dir DIR``: rank 0 saves the model, the optimizer (its momentum) and the step every
``--checkpoint-every`` steps with ``torch.save``, atomically (see ``checkpoint.py``); a job started
again resumes from the newest complete checkpoint (``torch.load(weights_only=True)`` on rank 0,
which DDP's start-up broadcast and one broadcast per momentum buffer hand to the other ranks).
The batches depend only on the step, so the resumed run ends with the parameters of a run that
never stopped: rank 0 prints ``final params sha256: <hex>`` at the end.
"""
from __future__ import annotations

import gc
import hashlib
import io
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import runtime
import training_args
import hccl.torch_backend  # noqa: F401  (registers the "hccl" backend; torch_npu: import torch_npu)

DIM, CLASSES, DEPTH = 32, 10, 3
N_TRAIN = 16384
CHECK_RTOL = 1e-6


def make_dataset(seed: int):
    """Gaussian blobs, one per class, shuffled: the same tensors on every rank."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, DIM, generator=g, dtype=torch.float64) * 2.0
    y = torch.randint(0, CLASSES, (N_TRAIN,), generator=g)
    x = centers[y] + torch.randn(N_TRAIN, DIM, generator=g, dtype=torch.float64) * 3.0
    return x, y


def make_model(hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers, width = [], DIM
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    layers.append(torch.nn.Linear(width, CLASSES))
    return torch.nn.Sequential(*layers).double()


def batch_rows(step: int, batch: int) -> slice:
    start = (step * batch) % (N_TRAIN - batch + 1)
    return slice(start, start + batch)


def train(model, opt, data, args, rows_of_rank=None, progress=None, start=0, save=None,
          mark=None, device="cpu"):
    """SGD steps ``start`` to ``args.steps``; a rank trains on its slice of every global batch
    (moved to ``device``); ``save(done)`` runs after every step (rank 0's checkpoints),
    ``mark()`` ends each step."""
    x, y = data
    for step in range(start, args.steps):
        rows = batch_rows(step, args.batch)
        xb, yb = x[rows], y[rows]
        if rows_of_rank is not None:
            xb, yb = xb[rows_of_rank], yb[rows_of_rank]
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        if progress:
            progress(step, loss)
        if save:
            save(step + 1)
        if mark:
            mark()


def make_optimizer(params, args):
    return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum)


def checkpoint_meta(model, world: int) -> dict:
    """What a checkpoint must match to be resumed: the world size and every parameter's shape."""
    return {"world_size": world,
            "shapes": {name: list(p.shape) for name, p in model.named_parameters()}}


def parse_torch(data: bytes) -> dict:
    """A checkpoint payload: tensors and plain values only (weights_only: nothing unpickled
    beyond them)."""
    return torch.load(io.BytesIO(data), weights_only=True)


def save_checkpoint(model, opt, args, world: int, done: int) -> None:
    """Rank 0: model, optimizer and step after ``done`` steps, every --checkpoint-every steps."""
    if done % args.checkpoint_every and done != args.steps:
        return
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": done}, buf)
    checkpoint.save(args.checkpoint_dir, done, buf.getvalue(), ".pt",
                    checkpoint_meta(model, world))


def broadcast_momentum(opt, state: dict | None) -> None:
    """Rank 0's optimizer state (``state``, loaded from a checkpoint) to every rank: SGD's one
    momentum buffer per parameter, which the other ranks do not have yet."""
    if dist.get_rank() == 0:
        opt.load_state_dict(state)
    for group in opt.param_groups:
        for p in group["params"]:
            buf = opt.state[p].get("momentum_buffer")
            if buf is None:
                buf = opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
            dist.broadcast(buf, src=0)


def reload(model, opt, map_location) -> None:
    """Round-trip the model and the optimizer through torch.save / torch.load and go on from
    what was loaded (``map_location`` None: where the tensors were saved from)."""
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, map_location=map_location, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])


def check(model, args, data) -> bool:
    """Replicas bitwise identical, and equal to one process on the full batches within 1e-6."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    digest = torch.frombuffer(bytearray(hashlib.blake2b(flat.numpy().tobytes(),
                                                        digest_size=32).digest()), dtype=torch.uint8)
    world = dist.get_world_size()
    every = [torch.empty(32, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(every, digest)
    verdict = torch.zeros(1, dtype=torch.int32)
    if dist.get_rank() == 0:
        differ = [r for r in range(world) if not torch.equal(every[r], every[0])]
        ref = make_model(args.hidden, args.seed)
        train(ref, make_optimizer(ref.parameters(), args), data, args)
        want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
        rel = float((flat - want).abs().max() / want.abs().max())
        ok = not differ and rel <= CHECK_RTOL and bool(torch.isfinite(flat).all())
        same = (f"{world} replicas bitwise identical" if not differ
                else f"replicas {differ} differ from rank 0")
        print(f"CHECK {'PASS' if ok else 'FAIL'}: {same}; max|ddp - single| / max|single| = "
              f"{rel:.2e} (limit {CHECK_RTOL:g}) over {flat.numel()} parameters after "
              f"{args.steps} steps", flush=True)
        verdict[0] = int(ok)
    dist.broadcast(verdict, src=0)            # every rank exits with rank 0's verdict
    return bool(verdict[0])


def parse_args(argv=None):
    p = training_args.parser(__doc__, depth=DEPTH, steps=60, batch=512, lr=0.05, bucket_mb=0.25,
                             bucket_help="several DDP buckets")
    p.add_argument("--backend", default="hccl", choices=["hccl", "gloo"],
                   help="torch.distributed backend (default hccl: npusim's)")
    p.add_argument("--device", default="cpu", choices=["cpu", "npu"],
                   help="where the model trains: CPU tensors, or npusim's torch npu device "
                        "(import torch_npu; hccl only)")
    p.add_argument("--reload-every", type=int, default=0, metavar="K",
                   help="every K steps, torch.save and torch.load the model and optimizer on "
                        "every rank and train on from the loaded state (default 0: never)")
    p.add_argument("--print-losses", action="store_true",
                   help="print every rank's loss of every step exactly (float.hex)")
    p.add_argument("--params-out", metavar="FILE",
                   help="rank 0 saves the final parameters there (torch.save, CPU tensors)")
    args = training_args.parse(p, argv, N_TRAIN)
    if args.device == "npu" and args.backend != "hccl":
        p.error("--device npu needs --backend hccl (gloo takes CPU tensors)")
    if args.reload_every < 0:
        p.error("--reload-every must be >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)        # one core per rank: ranks share the machine's cores
    device, local_rank = "cpu", int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "npu":
        import torch_npu  # noqa: F401  (npusim's torch npu device)
        torch.npu.set_device(local_rank)
        device = f"npu:{local_rank}"
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        if rank == 0:
            print(f"error: --batch {args.batch} is not a multiple of the {world} ranks",
                  file=sys.stderr)
        dist.destroy_process_group()
        return 2
    data = make_dataset(args.seed)
    model = make_model(args.hidden, args.seed + rank)   # DDP broadcasts rank 0's weights
    found = None
    if rank == 0 and args.checkpoint_dir:
        found = checkpoint.latest(args.checkpoint_dir, checkpoint_meta(model, world), parse_torch)
        if found is not None:
            model.load_state_dict(found.state["model"])
    model = model.to(device)
    start = torch.tensor([found.step if found else 0])
    dist.broadcast(start, src=0)
    start = int(start[0])
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb,
              device_ids=[local_rank] if args.device == "npu" else None)
    opt = make_optimizer(ddp.parameters(), args)
    if start:
        broadcast_momentum(opt, found.state["optim"] if found else None)
        if rank == 0:
            print(f"resumed from step {start}", flush=True)
    local = args.batch // world
    mine = slice(rank * local, (rank + 1) * local)
    nparams = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"MLP {DIM}-{'-'.join([str(args.hidden)] * DEPTH)}-{CLASSES}: {nparams} float64 "
              f"parameters on {args.device}, backend {args.backend}, {world} ranks x {local} "
              f"samples = global batch {args.batch}", flush=True)
    every = max(1, args.steps // 5)

    def progress(step, loss):
        if args.print_losses:
            print(f"loss rank {rank} step {step + 1} {loss.item().hex()}", flush=True)
        if rank == 0 and (step % every == 0 or step in (start, args.steps - 1)):
            print(f"step {step + 1}/{args.steps}  local loss {loss.item():.4f}", flush=True)
        if args.reload_every and (step + 1) % args.reload_every == 0:
            # alternately where they were saved from, and mapped explicitly
            again = (step + 1) // args.reload_every % 2 == 0
            reload(model, opt, None if again else (device if args.device == "npu" else "cpu"))

    save = None
    if rank == 0 and args.checkpoint_dir:
        def save(done):
            save_checkpoint(model, opt, args, world, done)
    t0 = time.perf_counter()
    # a step per iteration in a profile (npurun --profile DIR; the first is set-up)
    train(ddp, opt, data, args, mine, progress, start, save, mark=runtime.profiler.step,
          device=device)
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        ran = args.steps - start
        print(f"trained {ran} steps in {elapsed:.2f} s "
              f"({ran * args.batch / elapsed:,.0f} samples/s) on {args.backend}", flush=True)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
        print(f"final params sha256: {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}",
              flush=True)
        if args.params_out:
            torch.save(flat, args.params_out)
    ok = check(model, args, data) if args.check else True
    # DDP's reducer holds the process group, and its reference cycles would keep it alive until
    # the interpreter's own teardown, where gloo's worker threads sometimes abort the process
    # (1 run in ~10 here, torch 2.13, after a passing run): release it while Python still runs.
    del ddp, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
