"""CPU-only use of transformers and accelerate in a venv where npusim (its torch_npu) is
installed, as on a CPU machine with the real torch_npu: the script never imports torch_npu
(the libraries may). ``--hide-torch-npu`` makes torch_npu unimportable first (a venv without
it), for the reference run.

Prints one JSON line: GPT-2's and Llama's logits (float.hex) of a CPU forward, the losses of
two accelerate steps on CPU around ``save_state`` / ``load_state``, and whether torch_npu got
imported (by the libraries).
"""
from __future__ import annotations

import json
import sys

if "--hide-torch-npu" in sys.argv:
    sys.modules["torch_npu"] = None      # find_spec says "absent", import raises ImportError

import torch  # noqa: E402

out = {}
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM)

torch.manual_seed(0)
ids = torch.randint(0, 64, (2, 8))
gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=16))
with torch.no_grad():
    for name, m in (("gpt2", gpt2), ("llama", llama)):
        logits = m(ids).logits
        assert logits.device.type == "cpu"
        out[name] = [float(v).hex() for v in logits.reshape(-1)[:64]]

from accelerate import Accelerator  # noqa: E402

acc = Accelerator(cpu=True)
torch.manual_seed(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, opt = acc.prepare(model, opt)
x, y = torch.randn(8, 4), torch.randn(8, 1)
losses = []
for step in range(4):
    if step == 2:
        acc.save_state(sys.argv[1])
        acc.load_state(sys.argv[1])
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    acc.backward(loss)
    opt.step()
    losses.append(float(loss).hex())
out["accelerate"] = losses
out["accelerator_device"] = str(acc.device)
out["torch_npu_imported"] = sys.modules.get("torch_npu") is not None
print(json.dumps(out))
