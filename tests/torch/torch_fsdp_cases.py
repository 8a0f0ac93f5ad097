"""Rank-side code of the FSDP2 / DTensor test: a small MLP sharded with ``fully_shard`` (FSDP2,
DTensor parameters, functional collectives underneath) trains a few steps; returns the losses."""
from __future__ import annotations

STEPS = 4


def fsdp_losses(rank: int, backend: str) -> list[float]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import hccl.torch_backend  # noqa: F401
    dist.init_process_group(backend=backend)
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 3)).double()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, world * 4, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (1, world * 4), generator=g)
    losses = []
    for _ in range(STEPS):
        rows = slice(rank * 4, rank * 4 + 4)
        loss = torch.nn.functional.cross_entropy(model(x[0, rows]), y[0, rows])  # one batch: falls
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    dist.destroy_process_group()
    return losses


def both_backends(rank: int) -> dict:
    return {"gloo": fsdp_losses(rank, "gloo"), "hccl": fsdp_losses(rank, "hccl")}
