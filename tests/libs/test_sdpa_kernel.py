"""``scaled_dot_product_attention`` on npu takes the CPU's fused kernel with masks and
grouped-query attention too, so forward and backward are the CPU's bits.

transformers' Llama (``num_key_value_heads < num_attention_heads``) calls sdpa with
``enable_gqa=True``; CPU eager runs its flash kernel on it, npu took torch's math decomposition,
and the Trainer's Llama drifted from CPU in the last bits from the second step
(tests/libs/test_transformers.py). Masks (float and boolean) took the math path the same way.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")

F = torch.nn.functional

CASES = {   # name: (query heads, key/value heads, mask shape or None, mask is bool, causal)
    "causal": (4, 4, None, False, True),
    "gqa causal": (4, 2, None, False, True),
    "float mask": (4, 4, (8, 8), False, False),
    "bool mask": (4, 4, (2, 1, 8, 8), True, False),
    "gqa bool mask": (4, 2, (8, 8), True, False),
    "gqa float mask": (4, 1, (2, 4, 8, 8), False, False),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_npu_is_cpu_bitwise(name):
    hq, hk, mshape, is_bool, causal = CASES[name]
    g = torch.Generator().manual_seed(len(name))
    q, gout = torch.randn(2, hq, 8, 8, generator=g), torch.randn(2, hq, 8, 8, generator=g)
    k, v = torch.randn(2, hk, 8, 8, generator=g), torch.randn(2, hk, 8, 8, generator=g)
    mask = None
    if mshape is not None:
        mask = (torch.rand(mshape, generator=g) > 0.3) if is_bool else torch.randn(mshape,
                                                                                 generator=g)
    results = []
    for dev in ("cpu", "npu"):
        ts = [t.clone().to(dev).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*ts, attn_mask=None if mask is None else
                                             mask.to(dev), is_causal=causal,
                                             enable_gqa=hq != hk)
        out.backward(gout.to(dev))
        results.append([out.detach().cpu()] + [t.grad.cpu() for t in ts])
    for what, a, b in zip(("output", "dq", "dk", "dv"), *results):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), f"{name}: {what} differs"
