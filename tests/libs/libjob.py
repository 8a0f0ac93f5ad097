"""What every job of tests/libs/ shares: the device of the run, and the record a rank writes.

A job runs twice, unchanged but for ``--device``: under ``npurun --nproc-per-node 2`` with
``--device npu`` (``import torch_npu``, tensors on ``npu:LOCAL_RANK``, backend "hccl") and under
``python -m torch.distributed.run --standalone --nproc-per-node 2`` with ``--device cpu`` (gloo,
no ``import torch_npu`` by the job itself; a library may import it). Each rank writes
``OUT/rank<R>.json`` (losses as ``float.hex``, seconds per step, whatever the job adds) and
``OUT/rank<R>.pt`` (final parameters, on the host); tests/libs/harness.py compares them.
"""
from __future__ import annotations

import argparse
import json
import os
import time


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--device", choices=["cpu", "npu"], required=True)
    p.add_argument("--out", required=True, help="directory for rank<R>.json and rank<R>.pt")
    p.add_argument("--steps", type=int, default=6)
    return p


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup(device: str):
    """The rank's torch device: ``npu:LOCAL_RANK`` after ``import torch_npu`` and
    ``torch.npu.set_device`` (a torch_npu script's first lines), or ``cpu``."""
    import torch
    if device == "npu":
        import torch_npu  # noqa: F401
        torch.npu.set_device(local_rank())
        return torch.device(f"npu:{local_rank()}")
    return torch.device("cpu")


def backend(device: str) -> str:
    return "hccl" if device == "npu" else "gloo"


def hexes(values) -> list[str]:
    return [float(v).hex() for v in values]


def host_state(state: dict) -> dict:
    """A state dict's tensors detached on the host (float bits unchanged)."""
    import torch
    return {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v)
            for k, v in state.items()}


class Timer:
    """Wall seconds of the steps the job times (``with timer:`` around its training)."""

    def __init__(self):
        self.seconds = 0.0
        self.steps = 0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *_):
        self.seconds += time.perf_counter() - self._t0

    def per_step(self) -> float:
        return self.seconds / self.steps if self.steps else float("nan")


def write(out: str, record: dict, params: dict | None = None) -> None:
    """This rank's record (json) and parameters (torch.save of host tensors)."""
    import torch
    os.makedirs(out, exist_ok=True)
    r = rank()
    if params is not None:
        torch.save(host_state(params), os.path.join(out, f"rank{r}.pt"))
    tmp = os.path.join(out, f"rank{r}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(record, rank=r, world=world()), f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(out, f"rank{r}.json"))
