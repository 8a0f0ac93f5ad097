"""torch's own distributed training libraries, unchanged, on the rank's device (``--case``):

- ``fsdp2``: ``fully_shard`` on every Linear and the model, AdamW; after half the steps a
  distributed checkpoint (``torch.distributed.checkpoint.save`` of the model's and the
  optimizer's sharded state dicts); a second sharded model and optimizer ``dcp.load`` it and
  train the rest (their losses are the first ones'); full parameters gathered at the end.
- ``tp``: tensor parallel with DTensor (``parallelize_module``: ColwiseParallel then
  RowwiseParallel), SGD with momentum; full parameters (``full_tensor()``).
- ``pp``: ``torch.distributed.pipelining``, two stages (rank 0 and rank 1), GPipe with 2
  microbatches; the last stage's losses, each rank's stage parameters.
- ``amp-bf16`` / ``amp-fp16``: DDP under ``torch.autocast(device, dtype)``; fp16 with
  ``torch.amp.GradScaler(device)`` (its scale and skipped steps recorded).

Each rank records its losses (float.hex) and parameters (host tensors).
"""
from __future__ import annotations

import os

import libjob

p = libjob.parser(__doc__)
p.add_argument("--case", required=True, choices=["fsdp2", "tp", "pp", "amp-bf16", "amp-fp16"])
p.add_argument("--backend", choices=["hccl", "gloo"],
               help="default: hccl on npu, gloo on CPU (hccl on CPU tensors: under npurun)")
args = p.parse_args()
device = libjob.setup(args.device)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if args.device == "cpu" and args.backend == "hccl":
    import hccl.torch_backend  # noqa: F401  (hccl on CPU tensors, under npurun)

dist.init_process_group(backend=args.backend or libjob.backend(args.device))
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DIM = 16
record: dict = {"device": str(device)}
timer = libjob.Timer()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.GELU(), torch.nn.Linear(32, 1))


def batch(step, rows=8, same_on_all_ranks=False):
    g = torch.Generator().manual_seed(1000 * step + (0 if same_on_all_ranks else RANK))
    x = torch.randn(rows, DIM, generator=g)
    return x.to(device), x.sum(1, keepdim=True).sin().to(device)


def fsdp2():
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_state_dict, set_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import torch.distributed.checkpoint as dcp

    mesh = init_device_mesh(device.type, (WORLD,))

    def build():
        model = mlp().to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train(model, opt, start, stop, losses):
        for step in range(start, stop):
            x, y = batch(step)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())

    ckpt = os.path.join(args.out, "dcp")
    half = args.steps // 2
    model, opt = build()
    losses: list = []
    with timer:
        train(model, opt, 0, half, losses)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        train(model, opt, half, args.steps, losses)
    timer.steps = args.steps
    model2, opt2 = build()
    msd2, osd2 = get_state_dict(model2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model2, opt2, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    losses2: list = []
    train(model2, opt2, half, args.steps, losses2)
    full = StateDictOptions(full_state_dict=True)
    params = {f"a.{k}": v for k, v in get_model_state_dict(model, options=full).items()}
    params.update({f"b.{k}": v for k, v in get_model_state_dict(model2, options=full).items()})
    record.update(losses=libjob.hexes(losses), losses_resumed=libjob.hexes(losses2))
    return params


def tp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh(device.type, (WORLD,))
    # every Linear parallelized: on npu the optimizer takes its foreach path (as on CUDA),
    # which cannot mix DTensor and plain parameters
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    model = parallelize_module(model.to(device), mesh, {"0": ColwiseParallel(),
                                                        "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    with timer:
        for step in range(args.steps):
            x, y = batch(step, same_on_all_ranks=True)      # TP: every rank sees the batch
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
    timer.steps = args.steps
    record["losses"] = libjob.hexes(losses)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v)
            for k, v in model.state_dict().items()}


def pp():
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    full = mlp()
    stage_mod = (full[:3] if RANK == 0 else full[3:]).to(device)
    stage = PipelineStage(stage_mod, stage_index=RANK, num_stages=WORLD, device=device)
    sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.05)
    losses = []
    with timer:
        for step in range(args.steps):
            x, y = batch(step, same_on_all_ranks=True)
            opt.zero_grad()
            if RANK == 0:
                sched.step(x)
            else:
                mb: list = []
                sched.step(target=y, losses=mb)
                losses.extend(mb)
            opt.step()
    timer.steps = args.steps
    record["losses"] = libjob.hexes(losses)
    return stage_mod.state_dict()


def amp(dtype):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = mlp().to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "npu" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    losses, scales, dtypes = [], [], set()
    with timer:
        for step in range(args.steps):
            x, y = batch(step)
            opt.zero_grad()
            with torch.autocast(device.type, dtype=dtype):
                out = ddp(x)
                loss = F.mse_loss(out, y)
            dtypes.update([str(out.dtype), str(loss.dtype)])
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                scales.append(float(scaler.get_scale()))
            losses.append(loss.detach().float().clone())
    timer.steps = args.steps
    record.update(losses=libjob.hexes(losses), scales=scales, dtypes=sorted(dtypes))
    return model.state_dict()


cases = {"fsdp2": fsdp2, "tp": tp, "pp": pp, "amp-bf16": lambda: amp(torch.bfloat16),
         "amp-fp16": lambda: amp(torch.float16)}
params = cases[args.case]()
record["s_per_step"] = timer.per_step()
libjob.write(args.out, record, params)
dist.barrier()
dist.destroy_process_group()
