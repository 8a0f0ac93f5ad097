"""accelerate's documented training loop, unchanged: the optimizer made before
``accelerator.prepare``, ``accelerator.backward``, ``save_state`` / ``load_state``.

Run 1 trains two epochs of 3 steps (an MLP with dropout, AdamW, a LambdaLR schedule, a
DataLoader sharded by accelerate) and calls ``save_state`` after the first. Run 2 builds
everything afresh with a second Accelerator, ``prepare``s it, ``load_state``s that checkpoint
and trains the second epoch: its losses are run 1's last three and its parameters run 1's, bit
for bit (dropout's generators are restored). The loader does not shuffle: accelerate's default
sampler draws each epoch's order from a generator its state files do not hold, so a resumed
shuffled epoch is another order, on CPU as on npu. On npu (``--device npu``: ``import
torch_npu``, nothing else; accelerate picks the npu device and "hccl"), on CPU
``Accelerator(cpu=True)`` (gloo).
"""
from __future__ import annotations

import os

import libjob

args = libjob.parser(__doc__).parse_args()
if args.device == "npu":
    import torch_npu  # noqa: F401

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402

DIM, N, BATCH = 16, 48, 8      # 3 steps an epoch at world 2


def data():
    g = torch.Generator().manual_seed(99)
    x = torch.randn(N, DIM, generator=g)
    y = (x @ torch.randn(DIM, 1, generator=g)).tanh() + 0.1 * torch.randn(N, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def build(accelerator):
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)      # before prepare, as documented
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    loader = torch.utils.data.DataLoader(data(), batch_size=BATCH)
    return accelerator.prepare(model, optimizer, loader, scheduler)


def train(accelerator, model, optimizer, loader, scheduler, epochs, losses, ckpt=None):
    """``epochs`` passes over the loader; ``save_state(ckpt)`` after the first one."""
    model.train()
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            losses.append(loss.detach().clone())
        if ckpt is not None and epoch == 0:
            accelerator.save_state(ckpt)


accelerator = Accelerator(cpu=args.device == "cpu")
ckpt = os.path.join(args.out, "state")
timer = libjob.Timer()

model, optimizer, loader, scheduler = build(accelerator)
losses: list = []
with timer:
    train(accelerator, model, optimizer, loader, scheduler, 2, losses, ckpt=ckpt)
timer.steps = len(losses)
params = libjob.host_state(accelerator.unwrap_model(model).state_dict())
ran_on = str(next(model.parameters()).device)
# the optimizer's parameters are the model's (the documented order: optimizer first)
same_params = all(any(p is q for q in model.parameters())
                  for g in optimizer.param_groups for p in g["params"])

# a second Accelerator (the state is the process's) holding only the fresh objects
accelerator2 = Accelerator(cpu=args.device == "cpu")
model2, optimizer2, loader2, scheduler2 = build(accelerator2)
accelerator2.load_state(ckpt)
losses2: list = []
train(accelerator2, model2, optimizer2, loader2, scheduler2, 1, losses2)
params2 = libjob.host_state(accelerator2.unwrap_model(model2).state_dict())

libjob.write(args.out, {
    "losses": libjob.hexes(losses),
    "losses_resumed": libjob.hexes(losses2),
    "device": ran_on,
    "accelerator_device": str(accelerator.device),
    "distributed_type": str(accelerator.distributed_type),
    "backend": str(accelerator.state.backend),
    "optimizer_holds_model_params": same_params,
    "state_files": sorted(os.listdir(ckpt)),
    "s_per_step": timer.per_step(),
}, params=dict({f"a.{k}": v for k, v in params.items()},
               **{f"b.{k}": v for k, v in params2.items()}))
accelerator.end_training()
