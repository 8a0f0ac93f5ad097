"""``torch.autocast("npu", dtype=...)``: CUDA's autocast lists and cast policies, for npu.

torch's autocast lists are C++ and registered per backend key; a Python backend gets none, so
without these kernels every operator ran in its input dtype under ``torch.autocast("npu")``
(losses came out bf16, and fp16 losses overflowed under GradScaler). Here the operators of CUDA's
lists in torch's ``ATen/autocast_mode.h`` (``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``,
``AT_FORALL_PROMOTE``, and the ban of ``binary_cross_entropy``), as registered for AutocastCUDA in
``autocast_mode.cpp``, get the same policy at the AutocastPrivateUse1 key:

- lower_precision_fp: floating npu tensors (not float64) are cast to the autocast dtype
  (``torch.get_autocast_dtype("npu")``: float16 by default, bfloat16 when asked);
- fp32: cast to float32;
- fp32_set_opt_dtype (softmax, log_softmax, sum, prod, cumsum, ...): when the first argument is
  an eligible tensor, an unset ``dtype`` becomes float32;
- fp32_append_dtype (``norm``): called as the overload with ``dtype=float32``;
- promote: every eligible argument is cast to the widest floating type among them.

A tensor is eligible as in torch's ``is_autocast_eligible``: a floating-point tensor on the
autocast's device (a CPU scalar tensor is not cast). Every other operator falls through.
The lists were taken from torch 2.13's header; ``LISTS`` names them for the tests.
"""
from __future__ import annotations

import torch

_AUTOCAST = torch._C.DispatchKey.AutocastPrivateUse1
_EXCLUDE = torch._C.DispatchKeySet(_AUTOCAST)

# (operator, overload or None), as torch 2.13's ATen/autocast_mode.h lists them for CUDA
LOWER_PRECISION_FP = (
    ("_convolution", "deprecated"), ("_convolution", None), ("conv1d", None), ("conv2d", None),
    ("conv3d", None), ("conv_tbc", None), ("conv_transpose1d", None),
    ("conv_transpose2d", "input"), ("conv_transpose3d", "input"), ("convolution", None),
    ("prelu", None), ("addmm", None), ("addmv", None), ("addr", None), ("matmul", None),
    ("einsum", None), ("mm", None), ("mv", None), ("linalg_vecdot", None), ("linear", None),
    ("addbmm", None), ("baddbmm", None), ("bmm", None), ("chain_matmul", None),
    ("linalg_multi_dot", None), ("_thnn_fused_lstm_cell", None), ("_thnn_fused_gru_cell", None),
    ("lstm_cell", None), ("gru_cell", None), ("rnn_tanh_cell", None), ("rnn_relu_cell", None),
    ("_scaled_dot_product_flash_attention", None), ("scaled_dot_product_attention", None))
FP32 = (
    ("acos", None), ("asin", None), ("cosh", None), ("erfinv", None), ("exp", None),
    ("expm1", None), ("log", None), ("log10", None), ("log2", None), ("log1p", None),
    ("reciprocal", None), ("rsqrt", None), ("sinh", None), ("tan", None),
    ("pow", "Tensor_Scalar"), ("pow", "Tensor_Tensor"), ("pow", "Scalar"), ("softplus", None),
    ("layer_norm", None), ("native_layer_norm", None), ("rms_norm", None), ("group_norm", None),
    ("frobenius_norm", "dim"), ("nuclear_norm", None), ("nuclear_norm", "dim"),
    ("cosine_similarity", None), ("poisson_nll_loss", None), ("cosine_embedding_loss", None),
    ("nll_loss", None), ("nll_loss2d", None), ("hinge_embedding_loss", None), ("kl_div", None),
    ("l1_loss", None), ("smooth_l1_loss", None), ("huber_loss", None), ("mse_loss", None),
    ("margin_ranking_loss", None), ("multilabel_margin_loss", None), ("soft_margin_loss", None),
    ("triplet_margin_loss", None), ("multi_margin_loss", None),
    ("binary_cross_entropy_with_logits", None), ("dist", None), ("pdist", None), ("cdist", None),
    ("renorm", None), ("logsumexp", None), ("upsample_nearest1d", None),
    ("_upsample_nearest_exact1d", None), ("upsample_nearest2d", None),
    ("_upsample_nearest_exact2d", None), ("upsample_nearest3d", None),
    ("_upsample_nearest_exact3d", None), ("upsample_linear1d", None),
    ("upsample_bilinear2d", None), ("_upsample_bilinear2d_aa", None),
    ("upsample_trilinear3d", None), ("upsample_bicubic2d", None), ("_upsample_bicubic2d_aa", None))
FP32_SET_OPT_DTYPE = (
    ("prod", None), ("prod", "dim_int"), ("softmax", "int"), ("log_softmax", "int"),
    ("cumprod", None), ("cumsum", None), ("linalg_vector_norm", None),
    ("linalg_matrix_norm", None), ("linalg_matrix_norm", "str_ord"), ("sum", None),
    ("sum", "dim_IntList"))
FP32_APPEND_DTYPE = (("norm", "Scalar", "ScalarOpt_dtype"),
                     ("norm", "ScalarOpt_dim", "ScalarOpt_dim_dtype"))
PROMOTE = (("addcdiv", None), ("addcmul", None), ("atan2", None), ("bilinear", None),
           ("cross", None), ("dot", None), ("vdot", None), ("grid_sampler", None),
           ("index_put", None), ("tensordot", None), ("scatter_add", None))
BANNED = (("binary_cross_entropy", None),)

_BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_"
    "logits\nor torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits "
    "are\nsafe to autocast.")


def _eligible(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "npu" and x.is_floating_point()


def _cast(x, dtype):
    if _eligible(x):
        return x if x.dtype in (dtype, torch.float64) else x.to(dtype)
    if isinstance(x, (list, tuple)) and x and any(isinstance(y, torch.Tensor) for y in x):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def _cast_all(args, kwargs, dtype):
    return [_cast(a, dtype) for a in args], {n: _cast(v, dtype) for n, v in kwargs.items()}


def _lower(op):
    def k(*args, **kwargs):
        args, kwargs = _cast_all(args, kwargs, torch.get_autocast_dtype("npu"))
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return k


def _fp32(op):
    def k(*args, **kwargs):
        args, kwargs = _cast_all(args, kwargs, torch.float32)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return k


def _first_eligible(args) -> bool:
    return bool(args) and _eligible(args[0]) and args[0].dtype != torch.float64


def _fp32_set_opt_dtype(op):
    pos = next(k for k, a in enumerate(op._schema.arguments) if a.name == "dtype")

    def k(*args, **kwargs):
        if _first_eligible(args):
            if pos < len(args):
                if args[pos] is None:
                    args = args[:pos] + (torch.float32,) + args[pos + 1:]
            elif kwargs.get("dtype") is None:
                kwargs = dict(kwargs, dtype=torch.float32)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return k


def _fp32_append_dtype(op, with_dtype):
    def k(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if _first_eligible(args):
                return with_dtype(*args, **kwargs, dtype=torch.float32)
            return op(*args, **kwargs)
    return k


def _promote_type(args, kwargs):
    lower = torch.get_autocast_dtype("npu")
    to = lower
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if not _eligible(t) or t.dtype == torch.float64:
                continue
            if to == torch.float32 or t.dtype == torch.float32:
                to = torch.float32
            elif not (to == lower and t.dtype == lower):
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return to


def _promote(op):
    def k(*args, **kwargs):
        args, kwargs = _cast_all(args, kwargs, _promote_type(args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return k


def _banned(*args, **kwargs):
    raise RuntimeError(_BCE_BANNED)


def _overload(name: str, overload):
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None, None
    ov = overload or "default"
    if ov not in packet.overloads():
        return None, None
    return getattr(packet, ov), name if overload is None else f"{name}.{overload}"


def register(lib) -> None:
    for policy, ops in ((_lower, LOWER_PRECISION_FP), (_fp32, FP32),
                        (_fp32_set_opt_dtype, FP32_SET_OPT_DTYPE), (_promote, PROMOTE)):
        for name, overload in ops:
            op, qual = _overload(name, overload)
            if op is not None:
                lib.impl(qual, policy(op), "AutocastPrivateUse1")
    for name, overload, redispatch in FP32_APPEND_DTYPE:
        op, qual = _overload(name, overload)
        with_dtype, _ = _overload(name, redispatch)
        if op is not None and with_dtype is not None:
            lib.impl(qual, _fp32_append_dtype(op, with_dtype), "AutocastPrivateUse1")
    for name, overload in BANNED:
        op, qual = _overload(name, overload)
        if op is not None:
            lib.impl(qual, _banned, "AutocastPrivateUse1")
