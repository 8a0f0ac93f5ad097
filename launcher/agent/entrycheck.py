"""A script that does not compile fails the job once, in npurun, before any rank starts; and
what the fork server should import for it.

Every rank would otherwise print the same SyntaxError (256 of them at world 256) and npurun
would report the first as a rank's failure. Only scripts given by path are compiled here: a
module (``-m``) would need its package imported to be found, which runs the user's code in
npurun; a program (``--no-python``) is not Python.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import traceback

# Libraries the fork server imports when the script does (``preload_for``): heavy, imported the
# same way by every rank, no thread and no per-rank state at import. torch: 1.6 s of CPU per
# rank here; DistributedDataParallel's constructor and torch.compile import torch._dynamo, 1.5 s
# more. A package that reads RANK at import would take rank 0's: none of these does.
_TORCH = ("torch", "torch.distributed")
_TORCH_DYNAMO = ("torch.nn.parallel", "torch._dynamo")


def _source(worker_args: list[str] | None) -> bytes | None:
    if not worker_args or worker_args[0].startswith("-"):
        return None
    try:
        with open(worker_args[0], "rb") as f:
            return f.read()
    except OSError:
        return None


def preload_for(worker_args: list[str] | None) -> list[str]:
    """What the fork server should import for the script in ``launcher.worker``'s arguments,
    beyond its own list: torch when the script imports it at its top level (torch._dynamo too
    when it names DistributedDataParallel or torch.compile), hccl.torch_backend when it
    imports that. Empty for a module (``-m``), a program, or a script that does not parse."""
    source = _source(worker_args)
    if source is None:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names = set()
    for node in tree.body:      # the top level only: what every rank imports for sure
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    roots = {n.split(".")[0] for n in names}
    out = []
    if "torch" in roots and importlib.util.find_spec("torch") is not None:
        out += _TORCH
        if b"DistributedDataParallel" in source or b"torch.compile" in source:
            out += _TORCH_DYNAMO
    if "hccl.torch_backend" in names:
        out.append("hccl.torch_backend")
    return out


def script_problem(worker_args: list[str] | None) -> str | None:
    """The SyntaxError of the script in ``launcher.worker``'s arguments, as Python prints it
    (file, line, the line and a caret), or None when it compiles (or is not a script)."""
    source = _source(worker_args)
    if source is None:      # unreadable: each rank reports it as Python would
        return None
    try:
        compile(source, os.path.abspath(worker_args[0]), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        return "".join(traceback.format_exception_only(type(e), e)).rstrip()
    return None
