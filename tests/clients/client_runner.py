"""One rank of a public client: run the script as ``python SCRIPT ARGS`` would, and record it.

    client_runner.py --mode npu|ref|ref-hccl --out DIR [--seed S] [--collect FILE] [--max-steps K]
                     -- SCRIPT [ARGS...]

npurun (``--mode npu``) or torchrun (``--mode ref``) starts this file once per rank. It runs
SCRIPT with ``runpy.run_path(..., run_name="__main__")``, with ``sys.argv`` and ``sys.path[0]``
as the interpreter would set them, so the script cannot tell it from ``python SCRIPT``. The
script is not changed here: the npu run gets the public file with its one documented line
added (run_clients.py writes that copy), the reference run gets the file itself.

What this runner adds, in both modes alike:

- ``torch.manual_seed(S + RANK)`` before the script starts. The clients seed nothing, so two
  runs could not be compared otherwise; a seed per rank keeps the ranks' data different, so
  DDP's gradient averaging has real work to do.
- a record of every scalar ``Tensor.backward()`` is called on (the losses, in call order) and
  of every module wrapped in ``DistributedDataParallel`` (its final ``state_dict``), both copied
  to CPU, and where it ran (the modules' devices, the process group's backend); plus, on
  rank 0, FILE (``--collect``: e.g. the checkpoint rank 0 saved in the shared
  working directory; another rank could read it while rank 0 still writes it), loaded to CPU.
  Written to ``DIR/rank<RANK>.pt`` when the script returns or calls ``sys.exit``.
- with ``--max-steps K``, the end of the script at its (K+1)-th scalar ``backward()`` call,
  before that backward runs (every rank stops at the same call, so no collective is left
  half-issued): for a script whose only size knob is its data set (ModelZoo's ``--dummy`` data
  is ImageNet-sized, 1,281,167 images an epoch). The record then holds K losses and the
  parameters after K optimizer steps (and the K+1 forward passes' BatchNorm statistics).
- torchvision importable on a CPU-only torch (tv_compat.py), for the clients that import it.

``--mode ref`` also installs ref_shim (CPU + gloo for CUDA/accelerator scripts), ``--mode
ref-hccl`` the same shim with npusim's "hccl" backend on the CPU tensors in gloo's place (under
npurun: the reference whose all_reduce adds in hccl's order, for worlds > 2); ``--mode npu``
installs nothing: the script's own ``from torch_npu.contrib import transfer_to_npu`` (or
``import torch_npu``) does the work.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("npu", "ref", "ref-hccl"), required=True)
    p.add_argument("--out", required=True, help="directory for rank<RANK>.pt")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--collect", action="append", default=[],
                   help="a file the script writes (in its cwd) to load and record, per rank")
    p.add_argument("--max-steps", type=int, default=None,
                   help="end the script at its (K+1)-th scalar backward() call")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.args[:1] == ["--"]:
        a.args = a.args[1:]
    return a


class StepLimit(BaseException):
    """Raised at the (K+1)-th scalar backward() with ``--max-steps K``: the script ends there.

    A BaseException, as SystemExit is, so that a script's ``except Exception`` does not take it.
    """


class Recorder:
    """Losses and DDP-wrapped modules of the running script (patched in by ``install``)."""

    def __init__(self, max_steps: int | None = None):
        self.losses = []
        self.modules = []
        self.max_steps = max_steps

    def install(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        rec = self
        backward = torch.Tensor.backward

        def recording_backward(self, *args, **kwargs):
            if self.numel() == 1:
                if rec.max_steps is not None and len(rec.losses) >= rec.max_steps:
                    raise StepLimit(rec.max_steps)
                rec.losses.append(self.detach().to("cpu").clone())
            return backward(self, *args, **kwargs)
        torch.Tensor.backward = recording_backward

        init = DDP.__init__

        def recording_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            rec.modules.append(self.module)
        DDP.__init__ = recording_init

    def dump(self, path: str, collect: list[str]) -> None:
        import torch
        state = [{k: v.detach().to("cpu").clone() for k, v in m.state_dict().items()}
                 for m in self.modules]
        files = {}
        for name in collect:
            if os.path.exists(name):
                files[name] = torch.load(name, map_location="cpu", weights_only=False)
        # where the script ran (npu:N / cpu, hccl / gloo): differs between the runs by design,
        # so run_clients.compare leaves it out; the tests check it
        where = {"devices": [sorted({str(p.device) for p in m.parameters()}) for m in self.modules],
                 "backend": None}
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            where["backend"] = str(dist.get_backend())
        torch.save({"losses": self.losses, "state": state, "files": files, "where": where}, path)


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    import torch
    from tests.clients import tv_compat
    tv_compat.prepare()
    if a.mode in ("ref", "ref-hccl"):
        from tests.clients import ref_shim
        ref_shim.install(backend="gloo" if a.mode == "ref" else "hccl")
    rec = Recorder(a.max_steps)
    rec.install()
    torch.manual_seed(a.seed + rank)
    script = os.path.abspath(a.script)
    sys.argv = [script, *a.args]
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except StepLimit:
        code = 0
    os.makedirs(a.out, exist_ok=True)
    rec.dump(os.path.join(a.out, f"rank{rank}.pt"), a.collect if rank == 0 else [])
    return code


if __name__ == "__main__":
    sys.exit(main())
