"""transformers' Trainer, unchanged, on a tiny causal LM built from a config (no download).

Trainer A trains ``--steps`` steps with the default TrainingArguments but for what makes it
small and quiet (max_steps, batch 4, a checkpoint every ``steps // 2`` steps, report_to="none",
``use_cpu`` on the CPU run); Trainer B, on a freshly built model, resumes from A's middle
checkpoint and trains to the end. Each rank records the loss of every forward of both trainers
(a forward hook on the model: the Trainer's own log rounds to 4 digits), A's and B's final
parameters, whether GPT-2's lm_head is still wte (tied), and on every rank ``generate()`` of the
final model: greedy tokens and their scores, and sampled tokens after ``torch.manual_seed``.
"""
from __future__ import annotations

import os

import libjob

p = libjob.parser(__doc__)
p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
p.add_argument("--no-find-unused", action="store_true",
               help="ddp_find_unused_parameters=False (the default is True for a PreTrainedModel)")
args = p.parse_args()
device = libjob.setup(args.device)

import torch  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM, Trainer, TrainingArguments)

VOCAB, SEQ, N = 64, 16, 64


class Data(torch.utils.data.Dataset):
    """Token sequences with a pattern to learn (each token the previous plus a per-row step)."""

    def __init__(self):
        g = torch.Generator().manual_seed(1234)
        start = torch.randint(0, VOCAB, (N, 1), generator=g)
        step = torch.randint(1, 5, (N, 1), generator=g)
        self.ids = (start + step * torch.arange(SEQ)) % VOCAB

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build():
    torch.manual_seed(0)
    if args.model == "gpt2":
        cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ * 2, n_embd=32, n_layer=2, n_head=2,
                         bos_token_id=0, eos_token_id=VOCAB - 1)
        return GPT2LMHeadModel(cfg)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ * 2,
                      bos_token_id=0, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1)
    return LlamaForCausalLM(cfg)


def hook_losses(model, into: list):
    def hook(mod, inputs, output):
        if mod.training and getattr(output, "loss", None) is not None:
            into.append(output.loss.detach().clone())   # the Trainer scales it in place
    return model.register_forward_hook(hook)


def training_args(out_dir: str) -> TrainingArguments:
    return TrainingArguments(output_dir=out_dir, max_steps=args.steps,
                             per_device_train_batch_size=4, save_steps=max(1, args.steps // 2),
                             logging_steps=1, report_to="none", use_cpu=args.device == "cpu",
                             disable_tqdm=True,
                             ddp_find_unused_parameters=False if args.no_find_unused else None)


def tied(model) -> bool | None:
    if args.model != "gpt2":
        return None
    return model.lm_head.weight is model.transformer.wte.weight


out_dir = os.path.join(args.out, "trainer")
timer = libjob.Timer()

model_a = build()
losses_a: list = []
hook_losses(model_a, losses_a)
trainer_a = Trainer(model=model_a, args=training_args(out_dir), train_dataset=Data())
with timer:
    trainer_a.train()
timer.steps += args.steps
params_a = libjob.host_state(trainer_a.model.state_dict())
tied_a = tied(trainer_a.model)
ran_on = str(next(trainer_a.model.parameters()).device)

model_b = build()
losses_b: list = []
hook_losses(model_b, losses_b)
trainer_b = Trainer(model=model_b, args=training_args(out_dir), train_dataset=Data())
ckpt = os.path.join(out_dir, f"checkpoint-{max(1, args.steps // 2)}")
trainer_b.train(resume_from_checkpoint=ckpt)
params_b = libjob.host_state(trainer_b.model.state_dict())

record = {
    "losses": libjob.hexes(losses_a),
    "losses_resumed": libjob.hexes(losses_b),
    "tied": [tied_a, tied(trainer_b.model)],
    "device": ran_on,
    "s_per_step": timer.per_step(),
    "checkpoint_files": sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else [],
}
params = dict({f"a.{k}": v for k, v in params_a.items()},
              **{f"b.{k}": v for k, v in params_b.items()})
libjob.write(args.out, record, params)      # the training's record, should generate() fail

# generate() with the final model, on the rank's device
model = trainer_b.model.eval()
prompt = Data().ids[:2, :4].to(device)
with torch.no_grad():
    mask = torch.ones_like(prompt)
    greedy = model.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=False,
                            output_scores=True, return_dict_in_generate=True,
                            pad_token_id=VOCAB - 1)
    torch.manual_seed(7)
    sampled = model.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=True,
                             top_k=10, pad_token_id=VOCAB - 1)

record.update(greedy=greedy.sequences.cpu().tolist(),
              greedy_scores=[libjob.hexes(s.float().cpu().reshape(-1)) for s in greedy.scores],
              sampled=sampled.cpu().tolist())
libjob.write(args.out, record, params)
