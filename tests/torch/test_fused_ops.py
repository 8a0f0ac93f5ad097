"""torch_npu's fused npu_* operators (torch_npu/fused) against independent plain-torch references.

Every reference here is written from torch_npu's documented formula, in float64 on CPU, with its
masks built element by element from the documented conditions; each operator runs on npu tensors
forward and backward, at float32 and bfloat16 tolerances.
"""
import math

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: E402

DEV = "npu"
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
DTYPES = [torch.float32, torch.bfloat16]
BIG = 2147483647


def close(a, b, dtype):
    torch.testing.assert_close(a.detach().cpu().double(), b.detach().cpu().double(), **TOL[dtype])


def leaf(t, dtype):
    """An npu leaf of ``t`` in ``dtype`` and the float64 CPU leaf of the same values."""
    x = t.to(dtype)
    return x.to(DEV).requires_grad_(), x.double().requires_grad_()


# ---------------------------------------------------------------- attention references

def keep_matrix(mode, sq, skv, pre=BIG, nxt=BIG, mask=None):
    """The documented sparse_mode table, position by position (True = computed)."""
    keep = torch.zeros(sq, skv, dtype=torch.bool)
    for i in range(sq):
        for j in range(skv):
            if mode == 0:
                ok = -pre <= j - i <= nxt
            elif mode == 1:
                ok = True
            elif mode == 2:
                ok = j <= i
            elif mode == 3:
                ok = j <= i + (skv - sq)
            else:
                ok = -pre <= j - i - (skv - sq) <= nxt
            if mask is not None and mode in (0, 1):
                ok = ok and not bool(mask[i, j])
            keep[i, j] = ok
    return keep


def ref_attention(q, k, v, keep, scale):
    """Naive BNSD attention in float64 with GQA by repeat; fully masked rows give 0."""
    g = q.size(1) // k.size(1)
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    keep = keep.expand_as(s)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    return p @ v, s


def to_layout(x, layout):             # x is BNSD
    b, n, s, d = x.shape
    return {"BNSD": x, "BSND": x.transpose(1, 2), "BSH": x.transpose(1, 2).reshape(b, s, n * d),
            "SBH": x.permute(2, 0, 1, 3).reshape(s, b, n * d)}[layout]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
def test_fusion_attention_layouts(layout, dtype):
    torch.manual_seed(1)
    B, N, NKV, SQ, SKV, D = 2, 4, 2, 5, 7, 8
    q0, k0, v0 = torch.randn(B, N, SQ, D), torch.randn(B, NKV, SKV, D), torch.randn(B, NKV, SKV, D)
    mask = torch.rand(B, 1, SQ, SKV) < 0.3              # B1SS, True = masked out
    mask[..., 0] = False
    qn, qr = leaf(q0, dtype)
    kn, kr = leaf(k0, dtype)
    vn, vr = leaf(v0, dtype)
    scale = 1 / math.sqrt(D)
    out, smax, ssum, sout, seed, offset, numels = torch_npu.npu_fusion_attention(
        to_layout(qn, layout), to_layout(kn, layout), to_layout(vn, layout), N, layout,
        atten_mask=mask.to(DEV), scale=scale, sparse_mode=1)
    ref, scores = ref_attention(qr, kr, vr, ~mask, scale)
    assert out.dtype == dtype and out.device.type == "npu"
    assert tuple(out.shape) == tuple(to_layout(ref, layout).shape)
    close(out, to_layout(ref, layout), dtype)
    # the softmax statistics: (B, N, Sq, 8) float32 row max and row sum of exp(s - max)
    rmax = scores.amax(-1)
    rsum = torch.exp(scores - rmax.unsqueeze(-1)).sum(-1)
    assert smax.shape == (B, N, SQ, 8) and smax.dtype == torch.float32
    close(smax[..., 3], rmax, dtype)
    close(ssum[..., 7], rsum, dtype)
    assert sout.numel() == 0 and (seed, offset, numels) == (0, 0, 0)
    gy = torch.randn(ref.shape, dtype=torch.float64)
    (out * to_layout(gy.to(dtype).to(DEV), layout)).sum().backward()
    (ref * gy.to(dtype).double()).sum().backward()
    for a, b in ((qn, qr), (kn, kr), (vn, vr)):
        close(a.grad, b.grad, dtype)


@pytest.mark.parametrize("mode,pre,nxt,sq,skv", [
    (0, 2, 1, 6, 6), (0, BIG, 0, 5, 5), (1, BIG, BIG, 5, 6), (2, BIG, BIG, 5, 7),
    (3, BIG, BIG, 5, 7), (3, BIG, BIG, 7, 5), (4, 2, 1, 5, 7), (4, 3, 0, 6, 6)])
def test_fusion_attention_sparse_modes(mode, pre, nxt, sq, skv):
    torch.manual_seed(2)
    B, N, D = 1, 2, 4
    q0, k0, v0 = torch.randn(B, N, sq, D), torch.randn(B, N, skv, D), torch.randn(B, N, skv, D)
    if mode in (0, 1):
        mask = torch.rand(sq, skv) < 0.25
    else:       # modes 2-4 take the compressed 2048x2048 mask; the geometry decides
        mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    keep = keep_matrix(mode, sq, skv, pre, nxt, mask if mode in (0, 1) else None)
    qn, qr = leaf(q0, torch.float32)
    kn, kr = leaf(k0, torch.float32)
    vn, vr = leaf(v0, torch.float32)
    out = torch_npu.npu_fusion_attention(qn, kn, vn, N, "BNSD", atten_mask=mask.to(DEV),
                                         scale=0.5, sparse_mode=mode, pre_tockens=pre,
                                         next_tockens=nxt)[0]
    ref = ref_attention(qr, kr, vr, keep, 0.5)[0]
    close(out, ref, torch.float32)
    assert torch.isfinite(out.cpu()).all()      # rows with nothing to attend give 0, not NaN
    out.sum().backward()
    ref.sum().backward()
    for a, b in ((qn, qr), (kn, kr), (vn, vr)):
        close(a.grad, b.grad, torch.float32)


def test_fusion_attention_pse_and_prefix_mode():
    """pse enters as scale * (q k^T + pse) and gets its gradient; sparse_mode 6 is the
    bottom-right causal mask plus each batch's first prefix[b] keys."""
    torch.manual_seed(17)
    B, N, SQ, SKV, D = 2, 2, 4, 6, 4
    q0, k0, v0 = torch.randn(B, N, SQ, D), torch.randn(B, N, SKV, D), torch.randn(B, N, SKV, D)
    pse0 = torch.randn(1, N, SQ, SKV)
    qn, qr = leaf(q0, torch.float32)
    kn, kr = leaf(k0, torch.float32)
    vn, vr = leaf(v0, torch.float32)
    pn, pr = leaf(pse0, torch.float32)
    prefix = [1, 3]
    out = torch_npu.npu_fusion_attention(qn, kn, vn, N, "BNSD", pse=pn, scale=0.5, sparse_mode=6,
                                         prefix=prefix,
                                         atten_mask=torch.ones(3072, 2048, device=DEV).bool())[0]
    keep = torch.zeros(B, 1, SQ, SKV, dtype=torch.bool)
    for b in range(B):
        for i in range(SQ):
            for j in range(SKV):
                keep[b, 0, i, j] = j <= i + (SKV - SQ) or j < prefix[b]
    s = (qr @ kr.transpose(-1, -2) + pr) * 0.5
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    ref = p @ vr
    close(out, ref, torch.float32)
    gy = torch.randn(ref.shape, dtype=torch.float64)
    (out * gy.float().to(DEV)).sum().backward()
    (ref * gy).sum().backward()
    for a, b in ((qn, qr), (kn, kr), (vn, vr), (pn, pr)):
        close(a.grad, b.grad, torch.float32)


@pytest.mark.parametrize("mode", [7, 8])
def test_fusion_attention_varlen_split_modes(mode):
    """7: every sequence bottom-right causal but the last, a band (pre, next) from the bottom
    right; 8: every sequence top-left causal but the first, that band."""
    torch.manual_seed(18)
    N, D = 2, 4
    qlens, kvlens = [3, 2, 4], [3, 5, 6]
    pre, nxt = (6, -2) if mode == 7 else (4, 1)
    q0 = torch.randn(sum(qlens), N, D)
    k0, v0 = torch.randn(sum(kvlens), N, D), torch.randn(sum(kvlens), N, D)
    cum = lambda ls: torch.tensor(ls).cumsum(0).tolist()     # noqa: E731
    out = torch_npu.npu_fusion_attention(
        q0.to(DEV), k0.to(DEV), v0.to(DEV), N, "TND", scale=0.5, sparse_mode=mode,
        pre_tockens=pre, next_tockens=nxt, actual_seq_qlen=cum(qlens), actual_seq_kvlen=cum(kvlens),
        atten_mask=torch.ones(2048, 2048, device=DEV).triu(1).bool())[0]
    refs, qa, ka = [], 0, 0
    for b, (sq, skv) in enumerate(zip(qlens, kvlens)):
        special = b == (len(qlens) - 1 if mode == 7 else 0)
        keep = keep_matrix(4 if special else (3 if mode == 7 else 2), sq, skv, pre, nxt)
        qi = q0[qa:qa + sq].transpose(0, 1)[None].double()
        ki = k0[ka:ka + skv].transpose(0, 1)[None].double()
        vi = v0[ka:ka + skv].transpose(0, 1)[None].double()
        refs.append(ref_attention(qi, ki, vi, keep, 0.5)[0][0].transpose(0, 1))
        qa, ka = qa + sq, ka + skv
    close(out, torch.cat(refs), torch.float32)


def test_fusion_attention_no_mask_ignores_sparse_mode():
    q = torch.randn(1, 2, 4, 4, device=DEV)
    full = torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD", scale=0.5)[0]
    same = torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD", scale=0.5, sparse_mode=3)[0]
    assert torch.equal(full.cpu(), same.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_fusion_attention_tnd_varlen(causal, dtype):
    torch.manual_seed(3)
    N, D = 2, 8
    qlens, kvlens = [3, 0, 5, 2], [3, 0, 6, 4]
    T, TK = sum(qlens), sum(kvlens)
    q0, k0, v0 = torch.randn(T, N, D), torch.randn(TK, N, D), torch.randn(TK, N, D)
    qn, qr = leaf(q0, dtype)
    kn, kr = leaf(k0, dtype)
    vn, vr = leaf(v0, dtype)
    cq = tuple(torch.tensor(qlens).cumsum(0).tolist())
    ck = tuple(torch.tensor(kvlens).cumsum(0).tolist())
    mask = torch.ones(2048, 2048, device=DEV).triu(1).bool() if causal else None
    res = torch_npu.npu_fusion_attention(qn, kn, vn, N, "TND", atten_mask=mask, scale=0.3,
                                         actual_seq_qlen=cq, actual_seq_kvlen=ck,
                                         sparse_mode=3 if causal else 0)
    tnd = torch_npu.npu_fusion_attention(qn, kn, vn, N, "TND", atten_mask=mask, scale=0.3,
                                         actual_seq_qlen=cq, actual_seq_kvlen=ck,
                                         sparse_mode=3 if causal else 0, softmax_layout="TND")
    outs, maxes, q_at, k_at = [], [], 0, 0
    for sq, skv in zip(qlens, kvlens):
        if sq:
            qi = qr[q_at:q_at + sq].transpose(0, 1)[None]
            ki = kr[k_at:k_at + skv].transpose(0, 1)[None]
            vi = vr[k_at:k_at + skv].transpose(0, 1)[None]
            keep = keep_matrix(3 if causal else 1, sq, skv)
            o, s = ref_attention(qi, ki, vi, keep, 0.3)
            outs.append(o[0].transpose(0, 1))
            maxes.append(s[0].amax(-1))
        q_at, k_at = q_at + sq, k_at + skv
    ref = torch.cat(outs)
    close(res[0], ref, dtype)
    rmax = torch.cat(maxes, dim=1)                           # (N, T)
    # default: shape (T, N, 8) with NTD storage; softmax_layout="TND": (T, N, 8) in order
    assert res[1].shape == (T, N, 8) and tnd[1].shape == (T, N, 8)
    close(res[1].view(N, T, 8)[..., 0], rmax, dtype)
    close(tnd[1][..., 0], rmax.t(), dtype)
    gy = torch.randn(ref.shape, dtype=torch.float64)
    (res[0] * gy.to(dtype).to(DEV)).sum().backward()
    (ref * gy.to(dtype).double()).sum().backward()
    for a, b in ((qn, qr), (kn, kr), (vn, vr)):
        close(a.grad, b.grad, dtype)


def test_fusion_attention_dropout_and_grad_op():
    torch.manual_seed(4)
    B, S, N, D = 2, 16, 2, 8
    q = torch.randn(B, S, N * D, device=DEV, requires_grad=True)
    k = torch.randn(B, S, N * D, device=DEV, requires_grad=True)
    v = torch.randn(B, S, N * D, device=DEV, requires_grad=True)
    torch.npu.manual_seed(123)
    r1 = torch_npu.npu_fusion_attention(q, k, v, N, "BSH", scale=0.25, keep_prob=0.5)
    torch.npu.manual_seed(123)
    r2 = torch_npu.npu_fusion_attention(q, k, v, N, "BSH", scale=0.25, keep_prob=0.5)
    r3 = torch_npu.npu_fusion_attention(q, k, v, N, "BSH", scale=0.25, keep_prob=0.5)
    assert r1[4] == r2[4] != r3[4]                     # the seed comes from the npu generator
    assert torch.equal(r1[0].cpu(), r2[0].cpu()) and not torch.equal(r1[0].cpu(), r3[0].cpu())
    assert r1[6] == B * N * S * S
    plain = torch_npu.npu_fusion_attention(q, k, v, N, "BSH", scale=0.25)[0]
    ratio = ((r1[0] - plain).abs().mean() / plain.abs().mean()).detach()
    assert 0.2 < float(ratio) < 2.0                    # dropout changed the output
    dy = torch.randn_like(r1[0])
    r1[0].backward(dy)
    grads = torch_npu.npu_fusion_attention_grad(
        q, k, v, dy, N, "BSH", softmax_max=r1[1], softmax_sum=r1[2], scale_value=0.25,
        keep_prob=0.5, seed=r1[4], offset=r1[5], numels=r1[6])
    assert len(grads) == 5
    for g, t in zip(grads[:3], (q, k, v)):
        torch.testing.assert_close(g.cpu(), t.grad.cpu(), atol=1e-5, rtol=1e-4)


def test_fusion_attention_bad_arguments_name_themselves():
    q = torch.randn(1, 2, 4, 4, device=DEV)
    with pytest.raises(ValueError, match="input_layout"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "NSD")
    with pytest.raises(ValueError, match="keep_prob"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD", keep_prob=0.0)
    with pytest.raises(ValueError, match="actual_seq_qlen"):
        t = q[0].transpose(0, 1)
        torch_npu.npu_fusion_attention(t, t, t, 2, "TND")
    with pytest.raises(ValueError, match="head_num"):
        torch_npu.npu_fusion_attention(q, q, q, 3, "BNSD")


@pytest.mark.parametrize("layout,smlayout", [("SBH", ""), ("TND", ""), ("TND", "TND")])
def test_ring_attention_update_merges_two_key_blocks(layout, smlayout):
    """Attention over keys [0, 4) and [4, 10) merged by the statistics == attention over all."""
    torch.manual_seed(14)
    B, N, S, SK, D = 2, 2, 5, 10, 4
    if layout == "SBH":
        q, k, v = torch.randn(S, B, N * D), torch.randn(SK, B, N * D), torch.randn(SK, B, N * D)
        run = lambda kk, vv: torch_npu.npu_fusion_attention(   # noqa: E731
            q.to(DEV), kk.to(DEV), vv.to(DEV), N, "SBH", scale=0.5)
        parts = [run(k[:4], v[:4]), run(k[4:], v[4:])]
        full = run(k, v)
    else:
        q, k, v = torch.randn(B * S, N, D), torch.randn(B * SK, N, D), torch.randn(B * SK, N, D)
        kb, vb = k.view(B, SK, N, D), v.view(B, SK, N, D)

        def run(lo, hi):
            kk, vv = kb[:, lo:hi].reshape(-1, N, D), vb[:, lo:hi].reshape(-1, N, D)
            return torch_npu.npu_fusion_attention(
                q.to(DEV), kk.to(DEV), vv.to(DEV), N, "TND", scale=0.5,
                actual_seq_qlen=[S * (i + 1) for i in range(B)],
                actual_seq_kvlen=[(hi - lo) * (i + 1) for i in range(B)], softmax_layout=smlayout)
        parts, full = [run(0, 4), run(4, SK)], run(0, SK)
    (o1, m1, s1), (o2, m2, s2) = (p[:3] for p in parts)
    out, m, s = torch_npu.npu_ring_attention_update(o1, m1, s1, o2, m2, s2, input_layout=layout,
                                                    input_softmax_layout=smlayout)
    close(out, full[0], torch.float32)
    close(m, full[1], torch.float32)
    close(s, full[2], torch.float32)


def test_apply_adam_w_matches_torch_adamw_and_apply_adam_its_formula():
    torch.manual_seed(15)
    p0 = torch.randn(6, 5)
    ref = p0.clone().requires_grad_()
    opt = torch.optim.AdamW([ref], lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    var, m, v = p0.clone().to(DEV), torch.zeros(6, 5, device=DEV), torch.zeros(6, 5, device=DEV)
    for step in range(1, 4):
        g = torch.randn(6, 5)
        ref.grad = g.clone()
        opt.step()
        out = torch_npu.npu_apply_adam_w(0.9 ** (step - 1), 0.99 ** (step - 1), 0.01, 0.1, 0.9,
                                         0.99, 1e-8, g.to(DEV), None, False, False,
                                         out=(var, m, v))
        assert out[0] is var
    torch.testing.assert_close(var.cpu(), ref.detach(), atol=1e-6, rtol=1e-6)
    var, m, v = p0.clone().to(DEV), torch.zeros(6, 5, device=DEV), torch.zeros(6, 5, device=DEV)
    g = torch.randn(6, 5)
    torch_npu.npu_apply_adam(0.9, 0.99, 0.01, 0.9, 0.99, 1e-8, g.to(DEV), False, False,
                             out=(var, m, v))
    mr, vr = 0.1 * g, 0.01 * g * g
    expect = p0 - 0.01 * math.sqrt(1 - 0.99) / (1 - 0.9) * mr / (vr.sqrt() + 1e-8)
    torch.testing.assert_close(var.cpu(), expect, atol=1e-6, rtol=1e-6)


def test_prompt_and_incre_flash_attention():
    torch.manual_seed(5)
    B, N, NKV, S, D = 2, 4, 2, 6, 8
    q, k, v = torch.randn(B, S, N * D), torch.randn(B, S, NKV * D), torch.randn(B, S, NKV * D)
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)
    out = torch_npu.npu_prompt_flash_attention(
        q.to(DEV), k.to(DEV), v.to(DEV), num_heads=N, num_key_value_heads=NKV, input_layout="BSH",
        scale_value=0.3, atten_mask=causal.to(DEV), actual_seq_lengths_kv=[6, 4])
    bn = lambda t, n: t.view(B, S, n, D).transpose(1, 2).double()   # noqa: E731
    keep = ~causal & (torch.arange(S) < torch.tensor([6, 4]).view(B, 1, 1, 1))
    ref = ref_attention(bn(q, N), bn(k, NKV), bn(v, NKV), keep, 0.3)[0]
    close(out, ref.transpose(1, 2).reshape(B, S, N * D), torch.float32)
    q1 = torch.randn(B, N, 1, D)
    kc, vc = torch.randn(B, NKV, S, D), torch.randn(B, NKV, S, D)
    out = torch_npu.npu_incre_flash_attention(
        q1.to(DEV), kc.to(DEV), vc.to(DEV), num_heads=N, num_key_value_heads=NKV,
        input_layout="BNSD", scale_value=0.3, actual_seq_lengths=[5, 3])
    keep = torch.arange(S).view(1, 1, 1, S) < torch.tensor([5, 3]).view(B, 1, 1, 1)
    close(out, ref_attention(q1.double(), kc.double(), vc.double(), keep, 0.3)[0], torch.float32)
    # the fused infer operator: BNSD in, BSND out, causal from the bottom-right, with its lse
    qs = torch.randn(B, N, 3, D)
    out, lse = torch_npu.npu_fused_infer_attention_score(
        qs.to(DEV), kc.to(DEV), vc.to(DEV), num_heads=N, num_key_value_heads=NKV,
        input_layout="BNSD_BSND", scale=0.3, sparse_mode=3, softmax_lse_flag=True,
        atten_mask=torch.ones(2048, 2048, device=DEV).triu(1).bool())
    keep = keep_matrix(3, 3, S)
    ref, scores = ref_attention(qs.double(), kc.double(), vc.double(), keep, 0.3)
    close(out, ref.transpose(1, 2), torch.float32)
    assert lse.shape == (B, N, 3, 1)
    close(lse, torch.logsumexp(scores, -1, keepdim=True), torch.float32)
    assert torch_npu.npu_fused_infer_attention_score(qs.to(DEV), kc.to(DEV), vc.to(DEV),
                                                     num_heads=N, num_key_value_heads=NKV,
                                                     input_layout="BNSD")[1].numel() == 0


# ---------------------------------------------------------------- norms, rope, activations

@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norms(dtype):
    torch.manual_seed(6)
    x0, r0, g0 = torch.randn(3, 5, 16), torch.randn(3, 5, 16), torch.rand(16) + 0.5
    xn, xr = leaf(x0, dtype)
    gn, gr = leaf(g0, dtype)
    y, rstd = torch_npu.npu_rms_norm(xn, gn, epsilon=1e-5)
    rref = 1 / torch.sqrt((xr * xr).mean(-1, keepdim=True) + 1e-5)
    yref = xr * rref * gr
    assert y.dtype == dtype and rstd.dtype == torch.float32 and rstd.shape == (3, 5, 1)
    close(y, yref, dtype)
    close(rstd, rref, dtype)
    gy = torch.randn(3, 5, 16, dtype=torch.float64)
    (y * gy.to(dtype).to(DEV)).sum().backward()
    (yref * gy.to(dtype).double()).sum().backward()
    close(xn.grad, xr.grad, dtype)
    close(gn.grad, gr.grad, dtype)
    y2, _, xsum = torch_npu.npu_add_rms_norm(xn, r0.to(dtype).to(DEV), gn)
    close(xsum, x0.to(dtype).double() + r0.to(dtype).double(), dtype)
    xs = xsum.detach().cpu().double()
    close(y2, xs / torch.sqrt((xs * xs).mean(-1, keepdim=True) + 1e-6) * gr.detach(), dtype)
    y3, _ = torch_npu.npu_gemma_rms_norm(xn, gn)
    xd = x0.to(dtype).double()
    close(y3, xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-6) * (1 + gr.detach()), dtype)


def rotate_reference(x, mode):
    """Element by element: half pairs (i, i + D/2), interleave pairs (2i, 2i + 1)."""
    out = torch.empty_like(x)
    d = x.size(-1)
    for i in range(d // 2):
        a, b = (i, i + d // 2) if mode == "half" else (2 * i, 2 * i + 1)
        out[..., a] = -x[..., b]
        out[..., b] = x[..., a]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul(mode, dtype):
    torch.manual_seed(7)
    B, S, N, D = 2, 5, 3, 8
    x0 = torch.randn(B, S, N, D)
    ang = torch.randn(1, S, 1, D)
    xn, xr = leaf(x0, dtype)
    cn, cr = leaf(ang.cos(), dtype)
    sn, sr = leaf(ang.sin(), dtype)
    y = torch_npu.npu_rotary_mul(xn, cn, sn, rotary_mode=mode)
    ref = cr * xr + sr * rotate_reference(xr, mode)
    close(y, ref, dtype)
    gy = torch.randn(B, S, N, D, dtype=torch.float64)
    (y * gy.to(dtype).to(DEV)).sum().backward()
    (ref * gy.to(dtype).double()).sum().backward()
    for a, b in ((xn, xr), (cn, cr), (sn, sr)):
        close(a.grad, b.grad, dtype)


def test_rotary_mul_rotate_matrix_and_apply_rotary_pos_emb():
    x = torch.randn(1, 4, 2, 8)
    cos, sin = torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8)
    rot = torch.zeros(8, 8)
    for i in range(4):                 # x @ rot == rotate_half(x)
        rot[i + 4, i] = -1
        rot[i, i + 4] = 1
    y = torch_npu.npu_rotary_mul(x.to(DEV), cos.to(DEV), sin.to(DEV), rotate=rot.to(DEV))
    ref = cos * x + sin * rotate_reference(x, "half")
    close(y, ref, torch.float32)
    q, k = x.clone().to(DEV), (x * 2).to(DEV)
    qo, ko = torch_npu.npu_apply_rotary_pos_emb(q, k, cos.to(DEV), sin.to(DEV))
    assert qo is q and ko is k
    close(q, ref, torch.float32)
    close(k, cos * 2 * x + sin * rotate_reference(2 * x, "half"), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_mrope(mode, dtype):
    """Multimodal rope: channel c of the rotary half takes its angle from the temporal, height
    or width position by mrope_section; each (x_a, x_b) pair rotates by that angle."""
    torch.manual_seed(23)
    T, NQ, NK, HS, RD, MAXLEN = 5, 2, 1, 12, 8, 16
    sections = [1, 1, 2]                                       # sums to RD / 2
    pos = torch.randint(0, MAXLEN, (3, T))
    ang = torch.randn(MAXLEN, RD // 2)
    cache = torch.cat((ang.cos(), ang.sin()), dim=-1)
    qn, qr = leaf(torch.randn(T, NQ * HS), dtype)
    kn, kr = leaf(torch.randn(T, NK * HS), dtype)
    qo, ko = torch_npu.npu_mrope(pos.to(DEV), qn, kn, cache.to(dtype).to(DEV), HS,
                                 mrope_section=sections, rotary_mode=mode)
    owner = [0] * sections[0] + [1] * sections[1] + [2] * sections[2]
    cache_d = cache.to(dtype).double()

    def ref(x, n):
        x = x.reshape(T, n, HS)
        out = x.clone()
        for t in range(T):
            for c in range(RD // 2):
                cos = cache_d[pos[owner[c], t], c]
                sin = cache_d[pos[owner[c], t], RD // 2 + c]
                a, b = (c, c + RD // 2) if mode == "half" else (2 * c, 2 * c + 1)
                out[t, :, a] = x[t, :, a] * cos - x[t, :, b] * sin
                out[t, :, b] = x[t, :, b] * cos + x[t, :, a] * sin
        return out.reshape(T, n * HS)
    rq, rk = ref(qr, NQ), ref(kr, NK)
    close(qo, rq, dtype)
    close(ko, rk, dtype)
    (qo.sum() + ko.sum()).backward()
    (rq.sum() + rk.sum()).backward()
    close(qn.grad, qr.grad, dtype)
    close(kn.grad, kr.grad, dtype)


def test_transpose_batchmatmul():
    x, w, b = torch.randn(4, 3, 5), torch.randn(3, 5, 6), torch.randn(6)
    y = torch_npu.npu_transpose_batchmatmul(x.to(DEV), w.to(DEV), bias=b.to(DEV),
                                            perm_x1=[1, 0, 2], perm_y=[1, 0, 2])
    close(y, (x.permute(1, 0, 2) @ w + b).permute(1, 0, 2), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_activations(dtype):
    torch.manual_seed(8)
    x0 = torch.randn(4, 6, 10)
    for dim in (-1, 1):
        xn, xr = leaf(x0, dtype)
        y = torch_npu.npu_swiglu(xn, dim=dim)
        a, b = xr.chunk(2, dim=dim)
        ref = a / (1 + torch.exp(-a)) * b
        close(y, ref, dtype)
        y.sum().backward()
        ref.sum().backward()
        close(xn.grad, xr.grad, dtype)
    xn, xr = leaf(x0, dtype)
    y, g = torch_npu.npu_geglu(xn, dim=-1, approximate=0)
    a, b = xr.chunk(2, dim=-1)
    gref = 0.5 * b * (1 + torch.erf(b / math.sqrt(2)))          # the right half is activated
    close(g, gref, dtype)
    close(y, a * gref, dtype)
    y.sum().backward()
    (a * gref).sum().backward()
    close(xn.grad, xr.grad, dtype)
    xn, xr = leaf(x0, dtype)
    y = torch_npu.npu_gelu_mul(xn, approximate="tanh")
    a, b = xr.chunk(2, dim=-1)
    ref = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))) * b
    close(y, ref, dtype)
    y.sum().backward()
    ref.sum().backward()
    close(xn.grad, xr.grad, dtype)
    xn, xr = leaf(x0, dtype)
    y = torch_npu.npu_fast_gelu(xn)
    ref = xr / (1 + torch.exp(-1.702 * xr))
    close(y, ref, dtype)
    y.sum().backward()
    ref.sum().backward()
    close(xn.grad, xr.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_clipped_swiglu(dtype):
    torch.manual_seed(20)
    xn, xr = leaf(torch.randn(3, 8) * 5, dtype)
    y = torch_npu.npu_clipped_swiglu(xn, alpha=1.702, limit=7.0, bias=1.0)
    a, b = xr[:, 0::2].clamp(max=7.0), xr[:, 1::2].clamp(-7.0, 7.0)
    ref = a * torch.sigmoid(1.702 * a) * (b + 1.0)
    close(y, ref, dtype)
    y.sum().backward()
    ref.sum().backward()
    close(xn.grad, xr.grad, dtype)
    x = xr.detach().float()
    y = torch_npu.npu_clipped_swiglu(x.to(DEV), interleaved=False,
                                     group_index=torch.tensor([1, 1]))
    a, b = x[:2, :4].clamp(max=7.0), x[:2, 4:].clamp(-7.0, 7.0)
    close(y[:2], a * torch.sigmoid(1.702 * a) * (b + 1.0), torch.float32)
    assert torch.equal(y[2].cpu(), torch.zeros(4))


# ---------------------------------------------------------------- MoE

@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_matmul(dtype):
    torch.manual_seed(9)
    xs0 = [torch.randn(3, 4), torch.randn(5, 4)]
    ws0 = [torch.randn(4, 6), torch.randn(4, 6)]
    bs0 = [torch.randn(6), torch.randn(6)]
    xs = [leaf(t, dtype) for t in xs0]
    ws = [leaf(t, dtype) for t in ws0]
    ys = torch_npu.npu_grouped_matmul([a for a, _ in xs], [a for a, _ in ws],
                                      bias=[b.to(dtype).to(DEV) for b in bs0])
    refs = [x @ w + b.to(dtype).double() for (_, x), (_, w), b in zip(xs, ws, bs0)]
    assert len(ys) == 2
    for y, r in zip(ys, refs):
        close(y, r, dtype)
    sum((y * y).sum() for y in ys).backward()
    sum((r * r).sum() for r in refs).backward()
    for (a, b) in xs + ws:
        close(a.grad, b.grad, dtype)
    # one x split by a cumulative group_list, one (g, k, n) weight, one output (split_item 3)
    xn, xr = leaf(torch.cat(xs0), dtype)
    wn, wr = leaf(torch.stack(ws0), dtype)
    y = torch_npu.npu_grouped_matmul([xn], [wn], group_list=[3, 8], split_item=3,
                                     group_type=0)
    ref = torch.cat([xr[:3] @ wr[0], xr[3:] @ wr[1]])
    assert len(y) == 1
    close(y[0], ref, dtype)
    y[0].sum().backward()
    ref.sum().backward()
    close(xn.grad, xr.grad, dtype)
    close(wn.grad, wr.grad, dtype)
    # group sizes as a tensor (group_list_type=1), silu activation, one output per group
    y = torch_npu.npu_grouped_matmul([xn], [wn], group_list=torch.tensor([3, 5]).to(DEV),
                                     group_list_type=1, group_type=0, act_type=5, split_item=0)
    close(y[1], torch.nn.functional.silu(xr[3:] @ wr[1]), dtype)


def test_grouped_matmul_k_grouped_is_the_weight_gradient():
    """MindSpeed's grouped-matmul backward: dW_i = x_i^T @ dy_i through group_type=2."""
    torch.manual_seed(19)
    x, dy = torch.randn(8, 4), torch.randn(8, 6)
    dw = torch_npu.npu_grouped_matmul([x.t().to(DEV)], [dy.to(DEV)], group_list=torch.tensor(
        [3, 8]).to(DEV), split_item=3, group_type=2, group_list_type=0)
    assert len(dw) == 1 and dw[0].shape == (2, 4, 6)
    close(dw[0], torch.stack([x[:3].t() @ dy[:3], x[3:].t() @ dy[3:]]), torch.float32)


def test_grouped_matmul_quantized_needs_a_kernel():
    x = torch.zeros(2, 4, dtype=torch.int8, device=DEV)
    with pytest.raises(NotImplementedError, match="npu_grouped_matmul"):
        torch_npu.npu_grouped_matmul([x], [x.t()])


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_token_permute_unpermute_doc_example(dtype):
    tokens = torch.tensor([[1., 1, 1], [2, 2, 2], [3, 3, 3], [0, 0, 0]], dtype=dtype)
    indices = torch.tensor([[0, 4], [4, 3], [4, 2], [1, 1]])
    tn = tokens.to(DEV).requires_grad_()
    perm, sorted_idx = torch_npu.npu_moe_token_permute(tn, indices.to(DEV), indices.numel())
    assert sorted_idx.dtype == torch.int32
    assert sorted_idx.cpu().tolist() == [0, 6, 7, 5, 3, 1, 2, 4]
    assert perm.cpu().float()[:, 0].tolist() == [1, 0, 0, 3, 2, 1, 2, 3]
    probs = torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0], [0.3, 0.7]], dtype=dtype)
    pn = probs.to(DEV).requires_grad_()
    back = torch_npu.npu_moe_token_unpermute(perm, sorted_idx, probs=pn)
    assert back.dtype == dtype
    # each token comes back weighted by the sum of its probs
    close(back, tokens.double() * probs.double().sum(1, keepdim=True), dtype)
    back.sum().backward()
    # d/dtoken = sum of its probs; d/dprob[t, j] = sum of token t's row
    close(tn.grad, probs.double().sum(1, keepdim=True).expand(4, 3), dtype)
    close(pn.grad, tokens.double().sum(1, keepdim=True).expand(4, 2), dtype)
    # num_out_tokens drops the tail of the sorted order
    perm6, _ = torch_npu.npu_moe_token_permute(tokens.to(DEV), indices.to(DEV), 6)
    assert perm6.shape == (6, 3)
    permn, _ = torch_npu.npu_moe_token_permute(tokens.to(DEV), indices.to(DEV), -2)
    assert permn.shape == (6, 3)


def test_moe_gating_and_expert_tokens():
    torch.manual_seed(10)
    x = torch.randn(5, 6)
    y, idx, row = torch_npu.npu_moe_gating_top_k_softmax(x.to(DEV), k=2)
    ry, ridx = torch.softmax(x, -1).topk(2, -1)
    close(y, ry, torch.float32)
    assert idx.dtype == torch.int32 and torch.equal(idx.cpu().long(), ridx)
    assert row.cpu().tolist() == [[r, 5 + r] for r in range(5)]
    finished = torch.tensor([False, True, False, False, True])
    _, idx2, _ = torch_npu.npu_moe_gating_top_k_softmax(x.to(DEV), finished.to(DEV), k=2)
    assert idx2.cpu()[1].tolist() == [6, 6] and torch.equal(idx2.cpu()[0], idx.cpu()[0])
    counts = torch_npu.npu_moe_compute_expert_tokens(torch.tensor([0, 0, 2, 2, 2, 3]).to(DEV), 5)
    assert counts.dtype == torch.int32 and counts.cpu().tolist() == [2, 2, 5, 6, 6]


def test_moe_init_and_finalize_routing_round_trip():
    """gating -> init_routing -> one weight per expert -> finalize_routing equals computing each
    token's k experts directly."""
    torch.manual_seed(16)
    rows, H, E, K = 6, 4, 3, 2
    x = torch.randn(rows, H)
    weights, bias = torch.randn(E, H, H), torch.randn(E, H)
    skip = torch.randn(rows, H)
    scales, experts, row_idx = torch_npu.npu_moe_gating_top_k_softmax(torch.randn(rows, E).to(DEV),
                                                                      k=K)
    ex, ex_row, ex_expert = torch_npu.npu_moe_init_routing(x.to(DEV), row_idx, experts, rows)
    assert ex.shape == (rows * K, H) and ex_row.dtype == ex_expert.dtype == torch.int32
    assert ex_expert.cpu().tolist() == sorted(experts.cpu().flatten().tolist())
    per_row = torch.stack([ex.cpu()[j] @ weights[e] for j, e in enumerate(ex_expert.cpu().tolist())])
    out = torch_npu.npu_moe_finalize_routing(per_row.to(DEV), skip.to(DEV), None, bias.to(DEV),
                                             scales, ex_row, experts)
    ref = skip.clone()
    for i in range(rows):
        for j in range(K):
            e = int(experts[i, j])
            ref[i] += float(scales[i, j]) * (x[i] @ weights[e] + bias[e])
    close(out, ref, torch.float32)
    hot = torch_npu.npu_one_hot(torch.tensor([5, 3, 2, 1], dtype=torch.int32).to(DEV), depth=5)
    assert hot.dtype == torch.float32 and hot.cpu().tolist() == [
        [0, 0, 0, 0, 0], [0, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0]]


# ---------------------------------------------------------------- softmax, layout, misc

@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_masked_softmax(dtype):
    torch.manual_seed(11)
    x0 = torch.randn(2, 2, 8, 8)
    mask = torch.rand(2, 1, 8, 8) < 0.3
    xn, xr = leaf(x0, dtype)
    y = torch_npu.npu_scaled_masked_softmax(xn, mask.to(DEV), scale=0.5)
    ref = torch.softmax((xr * 0.5).masked_fill(mask, -10000.0), -1)
    close(y, ref, dtype)
    gy = torch.randn(2, 2, 8, 8, dtype=torch.float64)
    (y * gy.to(dtype).to(DEV)).sum().backward()
    (ref * gy.to(dtype).double()).sum().backward()
    close(xn.grad, xr.grad, dtype)
    y = torch_npu.npu_scaled_masked_softmax(xn, None, scale=1.0, fixed_triu_mask=True)
    causal = torch.ones(8, 8, dtype=torch.bool).triu(1)
    close(y, torch.softmax(xr.masked_fill(causal, -10000.0), -1), dtype)


def test_confusion_transpose_and_formats():
    x = torch.rand(2, 3, 4, 6, device=DEV, requires_grad=True)
    y = torch_npu.npu_confusion_transpose(x, (0, 2, 1, 3), (2, 4, 18), True)
    assert y.shape == (2, 4, 18)
    assert torch.equal(y.cpu(), x.detach().cpu().permute(0, 2, 1, 3).reshape(2, 4, 18))
    y2 = torch_npu.npu_confusion_transpose(x, (0, 2, 1), (2, 12, 6), False)
    assert y2.shape == (2, 6, 12)
    (y.sum() + y2.sum()).backward()
    assert torch.equal(x.grad.cpu(), torch.full((2, 3, 4, 6), 2.0))
    assert torch_npu.get_npu_format(x) == 0                   # NCHW, a 4-d tensor's base
    assert torch_npu.get_npu_format(torch.zeros(3, device=DEV)) == 2     # ND
    nz = torch_npu.npu_format_cast(x, 29)
    assert torch_npu.get_npu_format(nz) == 29 and torch_npu.get_npu_format(x) == 0
    assert torch.equal(nz.detach().cpu(), x.detach().cpu())
    nz.sum().backward()                                        # the cast is differentiable
    w = torch.zeros(4, 4, device=DEV)
    assert torch_npu.npu_format_cast_(w, 29) is w and torch_npu.get_npu_format(w) == 29
    with pytest.raises(ValueError, match="acl_format"):
        torch_npu.npu_format_cast(w, 7)
    m, i = torch_npu.npu_max(x.detach(), 2)
    assert i.dtype == torch.int32 and torch.equal(m.cpu(), x.detach().cpu().max(2).values)
    assert torch_npu.npu_broadcast(torch.tensor([[1], [2]], device=DEV), [2, 3]).cpu().tolist() \
        == [[1, 1, 1], [2, 2, 2]]


def test_dropout_with_add_softmax_and_cross_entropy():
    x, x1 = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    torch.npu.manual_seed(5)
    mask, sm, out = torch_npu.npu_dropout_with_add_softmax(x.to(DEV), x1.to(DEV), 0.5, 0.25, -1)
    ref = torch.softmax(x1 + 0.5 * x, -1)
    close(sm, ref, torch.float32)
    keep = mask.cpu().view(2, 2, 4, 8).bool()
    close(out, torch.where(keep, ref / 0.75, torch.zeros_like(ref)), torch.float32)
    assert 0.5 < keep.float().mean() < 0.95
    labels = torch.softmax(torch.randn(3, 5), -1)
    feats = torch.randn(3, 5)
    loss = torch_npu.npu_softmax_cross_entropy_with_logits(feats.to(DEV), labels.to(DEV))
    close(loss, -(labels * torch.log_softmax(feats, -1)).sum(-1), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_norm_silu_and_swish(dtype):
    torch.manual_seed(21)
    x0, w0, b0 = torch.randn(2, 6, 3, 2), torch.rand(6) + 0.5, torch.randn(6)
    xn, xr = leaf(x0, dtype)
    wn, wr = leaf(w0, dtype)
    bn, br = leaf(b0, dtype)
    g = xr.reshape(2, 3, -1)
    mean = g.mean(-1)
    rstd = 1 / torch.sqrt(((g - mean[..., None]) ** 2).mean(-1) + 1e-5)
    normed = ((g - mean[..., None]) * rstd[..., None]).reshape(2, 6, 3, 2)
    normed = normed * wr.view(1, 6, 1, 1) + br.view(1, 6, 1, 1)
    y, m, r = torch_npu.npu_group_norm_silu(xn, wn, bn, 3, 1e-5)
    ref = normed * torch.sigmoid(normed)
    assert m.shape == r.shape == (2, 3) and m.dtype == dtype
    close(y, ref, dtype)
    close(m, mean, dtype)
    close(r, rstd, dtype)
    y.sum().backward()
    ref.sum().backward()
    for a, b in ((xn, xr), (wn, wr), (bn, br)):
        close(a.grad, b.grad, dtype)
    y2 = torch_npu.npu_group_norm_swish(xn.detach(), 3, wn.detach(), bn.detach(), eps=1e-5,
                                        swish_scale=2.0)[0]
    close(y2, normed.detach() * torch.sigmoid(2.0 * normed.detach()), dtype)


def test_sign_bits_and_scatter_updates_doc_examples():
    a = torch.tensor([5, 4, 3, 2, 0, -1, -2, 4, 3, 2, 1, 0, -1, -2], dtype=torch.float32)
    packed = torch_npu.npu_sign_bits_pack(a.to(DEV), 2)
    assert packed.dtype == torch.uint8 and packed.cpu().tolist() == [[159], [15]]
    unpacked = torch_npu.npu_sign_bits_unpack(packed.reshape(-1), 2, torch.float32)
    assert unpacked.cpu().tolist() == [[1, 1, 1, 1, 1, -1, -1, 1], [1, 1, 1, 1, -1, -1, -1, -1]]
    data = torch.tensor([[[[1.] * 8, [2.] * 8]]], device=DEV)
    out = torch_npu.scatter_update(data, torch.tensor([1], device=DEV),
                                   torch.tensor([[[[3.] * 8]]], device=DEV), axis=-2)
    assert out.cpu().tolist() == [[[[1.] * 8, [3.] * 8]]]
    assert data.cpu().tolist() == [[[[1.] * 8, [2.] * 8]]]          # data itself is unchanged
    assert torch_npu.scatter_update_(data, torch.tensor([0], device=DEV),
                                     torch.full((1, 1, 1, 8), 5.0, device=DEV), -2) is data
    assert data.cpu()[0, 0, 0].tolist() == [5.] * 8
    var = torch.zeros(4, 5, 6, device=DEV)
    upd = torch.randn(3, 6)
    res = torch_npu.npu_scatter_nd_update(var, torch.tensor([[0, 1], [2, 3], [3, 4]], device=DEV),
                                          upd.to(DEV))
    expect = torch.zeros(4, 5, 6)
    expect[0, 1], expect[2, 3], expect[3, 4] = upd
    assert torch.equal(res.cpu(), expect) and var.abs().sum().item() == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_loss(dtype):
    torch.manual_seed(22)
    x0, target = torch.randn(6, 5), torch.tensor([0, 4, 2, -100, 1, 3])
    w = torch.rand(5) + 0.5
    xn, xr = leaf(x0, dtype)
    loss, log_prob, zloss, lse = torch_npu.npu_cross_entropy_loss(
        xn, target.to(DEV), weight=w.to(DEV), reduction="mean", ignore_index=-100)
    lp = xr - torch.logsumexp(xr, -1, keepdim=True)
    keep = target != -100
    t = target.clamp(min=0)
    picked = -lp[torch.arange(6), t] * w.double()[t]
    ref = picked[keep].sum() / w.double()[t][keep].sum()
    assert loss.shape == (1,) and zloss.numel() == 0 and lse.numel() == 0
    close(loss, ref.reshape(1), dtype)
    close(log_prob, lp, dtype)
    loss.sum().backward()
    ref.backward()
    close(xn.grad, xr.grad, dtype)
    none = torch_npu.npu_cross_entropy_loss(xn.detach(), target.to(DEV), reduction="none",
                                            label_smoothing=0.1)[0]
    close(none, torch.nn.functional.cross_entropy(x0.to(dtype).double(), target,
                                                  reduction="none", label_smoothing=0.1), dtype)


def test_pad_indexing_and_npu_dropout():
    x = torch.tensor([[20., 20, 10, 10]], device=DEV)
    assert torch_npu.npu_pad(x, [1, 1, 1, 1]).cpu().tolist() == [
        [0, 0, 0, 0, 0, 0], [0, 20, 20, 10, 10, 0], [0, 0, 0, 0, 0, 0]]
    m = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32, device=DEV)
    assert torch_npu.npu_indexing(m, [0, 0], [2, 2], [1, 1]).cpu().tolist() == [[1, 2], [5, 6]]
    assert torch_npu.npu_indexing(m, [1, 0], [2, 4], [1, 2], shrink_axis_mask=1).cpu().tolist() \
        == [5, 7]
    torch.npu.manual_seed(3)
    x = torch.arange(1., 201.).to(DEV)
    out, mask = torch_npu._npu_dropout(x, 0.3)
    assert mask.dtype == torch.uint8 and mask.numel() == 256 // 8       # padded to 128 elements
    bits = torch.tensor([(int(b) >> i) & 1 for b in mask.cpu().tolist() for i in range(8)])
    keep = bits[:200].bool()
    assert torch.equal(out.cpu(), torch.where(keep, x.cpu() / 0.7, torch.zeros(200)))
    assert int(bits[200:].sum()) == 0 and 0.5 < keep.float().mean() < 0.9


def test_fusion_attention_v2_rope_split_and_pse_type():
    """query_rope / key_rope add q_rope @ k_rope^T to the scores; pse_type 0 adds pse after
    the scale; the infer v2 operator is v1 under new names."""
    torch.manual_seed(24)
    T, N, D, R = 6, 2, 8, 4
    q, k, v = torch.randn(T, N, D), torch.randn(T, N, D), torch.randn(T, N, D)
    qr, kr = torch.randn(T, N, R), torch.randn(T, N, R)
    out = torch_npu.npu_fusion_attention_v2(
        q.to(DEV), k.to(DEV), v.to(DEV), N, "TND", query_rope=qr.to(DEV), key_rope=kr.to(DEV),
        atten_mask=torch.ones(2048, 2048, device=DEV).triu(1).bool(), scale=0.3, sparse_mode=3,
        actual_seq_qlen=[T], actual_seq_kvlen=[T])
    assert len(out) == 7
    bn = lambda t: t.transpose(0, 1)[None].double()                 # noqa: E731
    s = (bn(q) @ bn(k).transpose(-1, -2) + bn(qr) @ bn(kr).transpose(-1, -2)) * 0.3
    p = torch.softmax(s.masked_fill(~keep_matrix(3, T, T), float("-inf")), -1)
    close(out[0], (p @ bn(v))[0].transpose(0, 1), torch.float32)
    qb, kb, vb = (torch.randn(1, N, 4, D) for _ in range(3))
    pse = torch.randn(1, N, 4, 4)
    out0 = torch_npu.npu_fusion_attention_v2(qb.to(DEV), kb.to(DEV), vb.to(DEV), N, "BNSD",
                                             pse=pse.to(DEV), pse_type=0, scale=0.5)[0]
    p0 = torch.softmax(0.5 * qb.double() @ kb.double().transpose(-1, -2) + pse.double(), -1)
    close(out0, p0 @ vb.double(), torch.float32)
    fia2 = torch_npu.npu_fused_infer_attention_score_v2(
        qb.to(DEV), kb.to(DEV), vb.to(DEV), num_query_heads=N, input_layout="BNSD",
        softmax_scale=0.5, return_softmax_lse=True)
    fia1 = torch_npu.npu_fused_infer_attention_score(
        qb.to(DEV), kb.to(DEV), vb.to(DEV), num_heads=N, input_layout="BNSD", scale=0.5,
        softmax_lse_flag=True)
    torch.testing.assert_close(fia2[0].cpu(), fia1[0].cpu())
    torch.testing.assert_close(fia2[1].cpu(), fia1[1].cpu())


def test_backward_operators_equal_autograd():
    torch.manual_seed(25)
    x = torch.randn(3, 4, 8, device=DEV, requires_grad=True)
    g = (torch.rand(8) + 0.5).to(DEV).requires_grad_()
    dy = torch.randn(3, 4, 8, device=DEV)
    y, rstd = torch_npu.npu_rms_norm(x, g)
    y.backward(dy)
    dx, dg = torch_npu.npu_rms_norm_backward(dy, x, g, rstd)
    assert dg.dtype == torch.float32
    torch.testing.assert_close(dx.cpu(), x.grad.cpu())
    torch.testing.assert_close(dg.cpu(), g.grad.cpu())
    x.grad = None
    out = torch_npu.npu_swiglu(x, dim=-1)
    dyh = torch.randn(out.shape, device=DEV)
    out.backward(dyh)
    torch.testing.assert_close(torch_npu.npu_swiglu_backward(dyh, x, -1).cpu(), x.grad.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_permute_with_routing_map(dtype):
    torch.manual_seed(26)
    T, E, H = 5, 3, 4
    routing = torch.zeros(T, E, dtype=torch.bool)
    for t, es in enumerate([(0, 2), (1, 2), (0, 1), (2, 0), (1, 0)]):
        routing[t, list(es)] = True
    probs = torch.rand(T, E) * routing
    tn, tr = leaf(torch.randn(T, H), dtype)
    pn, pr = leaf(probs, dtype)
    perm, pprobs, idx = torch_npu.npu_moe_token_permute_with_routing_map(
        tn, routing.to(DEV), probs=pn, num_out_tokens=2 * T)
    # expert-major, tokens ascending within an expert
    expect = [t for e in range(E) for t in range(T) if routing[t, e]]
    assert idx.dtype == torch.int32 and idx.cpu().tolist() == expect
    close(perm, tr[expect], dtype)
    close(pprobs, torch.stack([pr[t, e] for e in range(E) for t in range(T) if routing[t, e]]),
          dtype)
    back = torch_npu.npu_moe_token_unpermute_with_routing_map(perm, idx, (T, H), probs=pn,
                                                              routing_map=routing.to(DEV))
    ref = tr * pr.sum(1, keepdim=True)             # each token back, weighted by its probs
    close(back, ref, dtype)
    back.sum().backward()
    ref.sum().backward()
    close(tn.grad, tr.grad, dtype)
    close(pn.grad, pr.grad * routing, dtype)
    # the doc example: rows go back to tokens 0 and 1 with the identity probs
    out = torch_npu.npu_moe_token_unpermute_with_routing_map(
        torch.tensor([[1.] * 4, [2.] * 4], device=DEV), torch.tensor([0, 1], device=DEV),
        [2, 4], probs=torch.eye(2, device=DEV), routing_map=torch.eye(2, device=DEV).bool())
    assert out.cpu().tolist() == [[1.] * 4, [2.] * 4]


def test_grouped_matmul_add_accumulates_weight_gradients():
    torch.manual_seed(27)
    x, dy = torch.randn(7, 3), torch.randn(7, 5)
    y = torch.ones(2 * 3, 5, device=DEV)
    out = torch_npu.npu_grouped_matmul_add_(y, x.to(DEV), dy.to(DEV),
                                            torch.tensor([4, 7], device=DEV))
    assert out is y
    expect = torch.cat([x[:4].t() @ dy[:4], x[4:].t() @ dy[4:]]) + 1
    close(y, expect, torch.float32)


def test_unsupported_operators_say_why():
    for name in ("npu_quant_matmul", "npu_mm_all_reduce_base", "npu_iou", "npu_get_float_status"):
        with pytest.raises(NotImplementedError, match=f"torch_npu.{name} is not supported"):
            getattr(torch_npu, name)(torch.zeros(1))
    assert len(torch_npu.fused.IMPLEMENTED) + len(torch_npu.fused.UNSUPPORTED) >= 119


def test_torch_ops_npu_namespace_differentiates():
    q = torch.randn(1, 2, 4, 4, device=DEV, requires_grad=True)
    mask = torch.ones(2048, 2048, device=DEV).triu(1).bool()
    r = torch.ops.npu.npu_fusion_attention(q, q, q, 2, "BNSD", atten_mask=mask, sparse_mode=2,
                                           scale=0.5)
    assert len(r) == 7 and r[4:] == (0, 0, 0)
    r[0].sum().backward()
    via_ops = q.grad.clone()
    q.grad = None
    torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD", atten_mask=mask, sparse_mode=2,
                                   scale=0.5)[0].sum().backward()
    assert torch.equal(via_ops.cpu(), q.grad.cpu())
    y, rstd = torch.ops.npu.npu_rms_norm(q, torch.ones(4, device=DEV))
    assert rstd.shape == (1, 2, 4, 1)
    assert torch.ops.npu.npu_swiglu(q, -1).shape == (1, 2, 4, 2)


def test_fused_ops_run_on_cpu_tensors_too():
    q = torch.randn(1, 3, 2, 4)
    out = torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", scale=0.5)[0]
    assert out.device.type == "cpu" and out.shape == q.shape
    assert torch_npu.npu_rms_norm(q, torch.ones(4))[0].device.type == "cpu"


# ---------------------------------------------------------------- a MindSpeed-style block

def _block(x, p, fused):
    """RMSNorm -> q/k/v -> RoPE -> causal attention -> out proj -> residual -> RMSNorm ->
    SwiGLU MLP -> residual, with torch_npu's fused operators or their unfused torch forms."""
    B, S, H = x.shape
    N, D = 4, H // 4
    if fused:
        h = torch_npu.npu_rms_norm(x, p["n1"], epsilon=1e-6)[0]
    else:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * p["n1"]
    q, k, v = ((h @ p[w]).view(B, S, N, D) for w in ("wq", "wk", "wv"))
    cos, sin = p["cos"], p["sin"]                                     # (1, S, 1, D)
    if fused:
        q = torch_npu.npu_rotary_mul(q, cos, sin)
        k = torch_npu.npu_rotary_mul(k, cos, sin)
        mask = torch.ones(2048, 2048, device=x.device).triu(1).bool()
        a = torch_npu.npu_fusion_attention(q, k, v, N, "BSND", atten_mask=mask, sparse_mode=2,
                                           scale=1 / math.sqrt(D))[0]
    else:
        def rot(t):
            t1, t2 = t[..., :D // 2], t[..., D // 2:]
            return t * cos + torch.cat((-t2, t1), -1) * sin
        q, k = rot(q), rot(k)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    x = x + a.reshape(B, S, H) @ p["wo"]
    if fused:
        h = torch_npu.npu_rms_norm(x, p["n2"], epsilon=1e-6)[0]
        m = torch_npu.npu_swiglu(h @ p["w13"], dim=-1)
    else:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * p["n2"]
        g, u = (h @ p["w13"]).chunk(2, -1)
        m = torch.nn.functional.silu(g) * u
    return x + m @ p["w2"]


def test_mindspeed_style_block_matches_unfused():
    torch.manual_seed(12)
    B, S, H, F = 2, 6, 16, 24
    D = H // 4
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    ang = torch.outer(torch.arange(S).float(), inv)
    ang = torch.cat((ang, ang), -1)[None, :, None, :]
    base = {"n1": torch.rand(H) + 0.5, "n2": torch.rand(H) + 0.5, "wq": torch.randn(H, H) / 4,
            "wk": torch.randn(H, H) / 4, "wv": torch.randn(H, H) / 4, "wo": torch.randn(H, H) / 4,
            "w13": torch.randn(H, 2 * F) / 4, "w2": torch.randn(F, H) / 4,
            "cos": ang.cos(), "sin": ang.sin()}
    x0 = torch.randn(B, S, H)
    runs = []
    for fused in (True, False):
        p = {n: t.to(DEV).requires_grad_(n not in ("cos", "sin")) for n, t in base.items()}
        x = x0.to(DEV).requires_grad_()
        y = _block(x, p, fused)
        y.pow(2).mean().backward()
        runs.append((y, x.grad, {n: t.grad for n, t in p.items() if t.requires_grad}))
    (yf, gxf, gpf), (yu, gxu, gpu) = runs
    torch.testing.assert_close(yf.cpu(), yu.cpu(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gxf.cpu(), gxu.cpu(), atol=1e-5, rtol=1e-5)
    for n in gpf:
        torch.testing.assert_close(gpf[n].cpu(), gpu[n].cpu(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- torch_npu.optim

@pytest.mark.parametrize("name,kwargs", [("NpuFusedAdamW", dict(lr=0.05, weight_decay=0.1)),
                                         ("NpuFusedAdam", dict(lr=0.05, weight_decay=0.1)),
                                         ("NpuFusedSGD", dict(lr=0.05, momentum=0.9))])
def test_fused_optimizers_match_torch(name, kwargs):
    import torch_npu.optim
    ref_cls = {"NpuFusedAdamW": torch.optim.AdamW, "NpuFusedAdam": torch.optim.Adam,
               "NpuFusedSGD": torch.optim.SGD}[name]
    torch.manual_seed(13)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    mod = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    mod.load_state_dict(ref.state_dict())
    mod.to(DEV)
    o_ref = ref_cls(ref.parameters(), foreach=False, **kwargs)
    o_npu = getattr(torch_npu.optim, name)(mod.parameters(), **kwargs)
    for step in range(4):
        x = torch.randn(8, 6)
        for m, o, xx in ((ref, o_ref, x), (mod, o_npu, x.to(DEV))):
            o.zero_grad()
            m(xx).pow(2).sum().backward()
            o.step()
    for a, b in zip(ref.parameters(), mod.parameters()):
        torch.testing.assert_close(a.detach(), b.detach().cpu(), atol=1e-6, rtol=1e-6)
    norm = o_npu.clip_grad_norm_fused_(0.1)
    total = torch.sqrt(sum(p.grad.cpu().pow(2).sum() for p in mod.parameters()))
    assert float(norm) > 0.1 and total <= 0.1 + 1e-6
    with pytest.raises(NotImplementedError, match="NpuFusedLamb"):
        torch_npu.optim.NpuFusedLamb(mod.parameters())
