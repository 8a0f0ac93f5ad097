"""Sparse all_reduce of the "hccl" torch backend, where gloo has one (COO tensors, SUM).

hccl reduces dense buffers only. A sparse sum is a concatenation: every rank gathers every
rank's (indices, values), padded to the largest nnz, and builds the same coalesced sum in rank
order, so all ranks hold the same bits (floats may differ from gloo's in the last bit, where
its summation order differs). Runs to completion at the call; the Work is already complete.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError
from .work import Work


class SparseAllReduce:
    """``all_reduce`` of sparse COO tensors over a process group ``pg``."""

    def __init__(self, pg):
        self._pg = pg

    def all_reduce(self, tensors, op) -> Work:
        kind = getattr(op, "op", op)
        if kind != dist.ReduceOp.SUM:
            raise InvalidArgumentError(f"allreduce: Cannot use ReduceOp.{kind.name} with sparse "
                                       "tensors (hccl, like gloo, sums them: ReduceOp.SUM)")
        dense = [t for t in tensors if not t.is_sparse]
        if dense:
            raise InvalidArgumentError("allreduce: tensors mix sparse and dense layouts; pass "
                                       "them in separate calls")
        for t in tensors:
            result = self._sum(t.detach().coalesce())
            with torch.no_grad():
                t.copy_(result)
        work = Work("allreduce", list(tensors))
        work.complete(None)
        return work

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's ``t`` (same shape on every rank), stacked in rank order."""
        out = torch.empty((self._pg.comm.size, *t.shape), dtype=t.dtype)
        self._pg.all_gather_single(out, t.contiguous()).wait()
        return out

    def _sum(self, t: torch.Tensor) -> torch.Tensor:
        idx, val = t.indices(), t.values()
        nnz = self._gather(torch.tensor([idx.shape[1]], dtype=torch.int64)).view(-1).tolist()
        most = max(nnz)
        pad_i = idx.new_zeros((idx.shape[0], most))
        pad_i[:, :idx.shape[1]] = idx
        pad_v = val.new_zeros((most, *val.shape[1:]))
        pad_v[:val.shape[0]] = val
        all_i, all_v = self._gather(pad_i), self._gather(pad_v)
        indices = torch.cat([all_i[r, :, :k] for r, k in enumerate(nnz)], dim=1)
        values = torch.cat([all_v[r, :k] for r, k in enumerate(nnz)])
        return torch.sparse_coo_tensor(indices, values, t.shape).coalesce()
