"""The user's line that issued an npu operator (what TaskError and the stream sanitizer name):
runtime.callsite's rule, with torch's and torch_npu's folders counted as library frames too
(hccl registers its own; runtime's is the rule's own)."""
from __future__ import annotations

import os

import torch

import runtime
from runtime.callsite import add_internal, callsite

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(runtime.__file__)))
add_internal(os.path.dirname(os.path.abspath(torch.__file__)))
add_internal(os.path.join(_ROOT, "torch_npu"))
add_internal(os.path.join(_ROOT, "hccl"))

user_site = callsite     # ``file:line in function`` of the first frame outside those folders
