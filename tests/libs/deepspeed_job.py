"""DeepSpeed, unchanged, with ZeRO stage ``--stage`` (1, 2 or 3), fp32, gradient clipping.

On npu: ``import torch_npu``, DeepSpeed picks its own NPU accelerator (``DS_ACCELERATOR``
unset) and the "hccl" backend. On CPU: ``DS_ACCELERATOR=cpu`` and ``init_distributed("gloo")``.
A small MLP with a torch AdamW (DeepSpeed's own fused optimizers are compiled ops), a fixed
batch per rank and step; ``save_checkpoint`` after half the steps and a second engine that
``load_checkpoint``s it and trains the rest: its losses are the first engine's last ones.
Each rank records every loss and the full (gathered) parameters at the end.
"""
from __future__ import annotations

import os

import libjob

p = libjob.parser(__doc__)
p.add_argument("--stage", type=int, choices=[1, 2, 3], required=True)
args = p.parse_args()
if args.device == "npu":
    import torch_npu  # noqa: F401
else:
    os.environ["DS_ACCELERATOR"] = "cpu"

import torch  # noqa: E402
import deepspeed  # noqa: E402

DIM, BATCH = 16, 8


def config():
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0, "steps_per_print": 10 ** 6,
            "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 200,
                                  "allgather_bucket_size": 200},
            "wall_clock_breakdown": False}


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config())
    return engine


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + libjob.rank())
    x = torch.randn(BATCH, DIM, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def train(engine, start, stop, losses):
    dev = engine.device
    for step in range(start, stop):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(engine(x.to(dev)), y.to(dev))
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach().clone())


def full_params(engine):
    if args.stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            return libjob.host_state(engine.module.state_dict())
    return libjob.host_state(engine.module.state_dict())


deepspeed.init_distributed(dist_backend=libjob.backend(args.device))
half = args.steps // 2
ckpt = os.path.join(args.out, "ds")
timer = libjob.Timer()
engine = build()
losses: list = []
with timer:
    train(engine, 0, half, losses)
    engine.save_checkpoint(ckpt, tag="half")
    train(engine, half, args.steps, losses)
timer.steps = args.steps
params = full_params(engine)
ran_on = str(engine.device)
accel = type(deepspeed.get_accelerator()).__name__

engine2 = build()
engine2.load_checkpoint(ckpt, tag="half")
losses2: list = []
train(engine2, half, args.steps, losses2)
params2 = full_params(engine2)

libjob.write(args.out, {
    "losses": libjob.hexes(losses), "losses_resumed": libjob.hexes(losses2),
    "device": ran_on, "accelerator": accel, "s_per_step": timer.per_step(),
    "skipped_steps": int(engine.skipped_steps),
}, params=dict({f"a.{k}": v for k, v in params.items()},
               **{f"b.{k}": v for k, v in params2.items()}))
