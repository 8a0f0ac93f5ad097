"""transformers' flash_attention_2 on npu: its Ascend path (transformers/integrations/
npu_flash_attention.py) calls torch_npu.npu_fusion_attention, BSND for unpadded batches and TND
with cumulative sequence lengths for padded ones, causal through sparse_mode 3 and the 2048x2048
mask. A tiny Llama built from its config trains with padded batches and matches sdpa.
"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch_npu  # noqa: E402,F401
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

npu_fa = pytest.importorskip("transformers.integrations.npu_flash_attention")

DEV = "npu"


def tiny_llama(impl, dtype=torch.float32, seed=0):
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attention_dropout=0.0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=impl, dtype=dtype)
    return model.to(DEV)


def padded_batch(step, left):
    """Two sequences of 12 with 0-5 padding tokens on one side; labels -100 on the padding."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, 96, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    for row, pad in enumerate((step % 3 + 1, (step * 2) % 5)):
        if pad:
            if left:
                mask[row, :pad] = 0
            else:
                mask[row, 12 - pad:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return ids.to(DEV), mask.to(DEV), labels.to(DEV)


@pytest.fixture
def layouts(monkeypatch):
    """The input_layout of every npu_fusion_attention call transformers makes."""
    seen = []
    real = npu_fa.npu_fusion_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("input_layout", args[4] if len(args) > 4 else None))
        return real(*args, **kwargs)
    monkeypatch.setattr(npu_fa, "npu_fusion_attention", spy)
    return seen


@pytest.mark.parametrize("left", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["right-pad", "left-pad"])      # ~10 s each on a quiet machine
def test_flash_attention_2_trains_like_sdpa(layouts, left):
    fa2, sdpa = tiny_llama("flash_attention_2"), tiny_llama("sdpa")
    assert fa2.config._attn_implementation == "flash_attention_2"
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (fa2, sdpa)]
    losses = {"fa2": [], "sdpa": []}
    for step in range(4):
        ids, mask, labels = padded_batch(step, left)
        for name, model, opt in (("fa2", fa2, opts[0]), ("sdpa", sdpa, opts[1])):
            opt.zero_grad()
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
            out.loss.backward()
            losses[name].append(out.loss.item())
        # every step's gradients agree (measured: <= 1.2e-6 where they reach 0.2)
        for (n, a), b in zip(fa2.named_parameters(), sdpa.parameters()):
            torch.testing.assert_close(a.grad.cpu(), b.grad.cpu(), atol=1e-5, rtol=1e-4,
                                       msg=lambda m: f"step {step} {n}: {m}")
        for opt in opts:
            opt.step()
    # the padded batches went through the varlen (TND) path, 2 layers x 4 steps
    assert layouts.count("TND") == 8, layouts
    torch.testing.assert_close(torch.tensor(losses["fa2"]), torch.tensor(losses["sdpa"]),
                               atol=1e-5, rtol=1e-5)
    assert losses["fa2"][-1] < losses["fa2"][0]                   # it trains
    # AdamW's first step turns gradients near its eps into updates near lr, so rounding-level
    # gradient differences leave ~2e-5 in a few weights (measured); 1e-4 bounds them
    for (n, a), b in zip(fa2.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=1e-4, rtol=1e-4,
                                   msg=n)


def test_flash_attention_2_unpadded_and_bf16(layouts):
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(7)).to(DEV)
    logits = {}
    for impl in ("flash_attention_2", "sdpa"):
        model = tiny_llama(impl, dtype=torch.bfloat16)
        logits[impl] = model(input_ids=ids).logits.float().cpu()
    assert layouts == ["BSND", "BSND"]          # no padding: the fixed-length path
    torch.testing.assert_close(logits["flash_attention_2"], logits["sdpa"], atol=3e-2, rtol=3e-2)


class _Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(i))
        mask = torch.ones(12, dtype=torch.long)
        mask[12 - i % 4:] = 0
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.slow
def test_trainer_adamw_torch_npu_fused_with_fa2_matches_adamw_torch_with_sdpa(tmp_path):
    """transformers' Trainer: optim="adamw_torch_npu_fused" builds torch_npu.optim.NpuFusedAdamW;
    with flash_attention_2 it logs the losses adamw_torch with sdpa logs."""
    from transformers import Trainer, TrainingArguments
    import torch_npu.optim
    logs = {}
    for impl, optim in (("flash_attention_2", "adamw_torch_npu_fused"), ("sdpa", "adamw_torch")):
        args = TrainingArguments(output_dir=str(tmp_path / impl), per_device_train_batch_size=4,
                                 max_steps=4, optim=optim, learning_rate=1e-2, report_to=[],
                                 save_strategy="no", logging_steps=1,
                                 dataloader_pin_memory=False)
        trainer = Trainer(model=tiny_llama(impl), args=args, train_dataset=_Tokens())
        trainer.train()
        if impl == "flash_attention_2":
            assert isinstance(trainer.optimizer.optimizer, torch_npu.optim.NpuFusedAdamW) or \
                isinstance(trainer.optimizer, torch_npu.optim.NpuFusedAdamW)
        logs[impl] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(logs["sdpa"]) == 4
    torch.testing.assert_close(torch.tensor(logs["flash_attention_2"]), torch.tensor(logs["sdpa"]),
                               atol=1e-4, rtol=1e-4)
