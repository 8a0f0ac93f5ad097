"""Dynamo never traces npusim's own Python.

An npu operator is a Python kernel that torch's dispatcher calls from C++. Under ``torch.compile``
Dynamo's frame callback sees every Python frame that starts while a compiled function runs, also
those the dispatcher starts: with ``DDP(model)``, whose hooks run eagerly inside the compiled
call, Dynamo tried to compile the fallback, then npusim's allocator (``view.view(_Owner)``:
"argument of type: <class 'type'>"). npusim's packages (runtime, hccl, torch_npu) are therefore
on Dynamo's skip list, as torch's own files and numpy are: their frames run as plain Python, and
a compiled function that calls one of them (``torch.npu.current_stream()``) breaks its graph
there, as at any skipped function.

The list is ``torch._dynamo.trace_rules.add`` (what torch uses for its own skipped modules; not
a documented API: ``torch.compiler.disable`` is, but it wraps every call in a switch of the frame
callback, a cost on every operator). Importing ``torch._dynamo`` takes 2-3 s, so npusim does not
import it: the packages are added when Dynamo's trace_rules module is imported (an import hook),
or at once when it already is (importhook.py).
"""
from __future__ import annotations

from .importhook import when_imported

_TARGET = "torch._dynamo.trace_rules"
PACKAGES = ("runtime", "hccl", "torch_npu")


def _skip(trace_rules) -> None:
    for name in PACKAGES:
        try:
            trace_rules.add(name)
        except Exception:          # a package not importable here (hccl without its extras)
            pass


def register() -> None:
    when_imported(_TARGET, _skip)
