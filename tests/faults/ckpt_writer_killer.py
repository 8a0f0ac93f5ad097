"""Run a training example, SIGKILLing rank 0 inside one checkpoint write of the first attempt.

    npurun --max-restarts 1 tests/faults/ckpt_writer_killer.py STEP SEED EXAMPLE ARGS...

In attempt 0 on rank 0, the write of checkpoint STEP is cut after K units (bytes written, plus
one per fsync, rename and unlink), K drawn with SEED from [0, the previous checkpoint's payload
size + its manifest's + 6]: anywhere from the first byte of the payload to the manifest's
rename. The example itself is unchanged: the helper's ``os`` is swapped for a counting proxy.
"""
from __future__ import annotations

import json
import os
import random
import runpy
import sys

from killing_os import KillingOs   # next to this script: sys.path[0]

step, seed, example, args = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
sys.path.insert(0, os.path.dirname(os.path.abspath(example)))
import checkpoint  # noqa: E402  (the example's helper, found next to it)


if os.environ.get("RANK") == "0" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    real_save = checkpoint.save

    def save(directory, at, payload, suffix, meta, keep=3):
        if at == step:
            manifests = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
            with open(os.path.join(directory, manifests[-1])) as f:
                prev = json.load(f)
            limit = prev["bytes"] + len(json.dumps(prev, indent=1)) + 6
            budget = random.Random(seed).randrange(limit)
            print(f"killer: checkpoint {step} will be cut after {budget} of ~{limit} units",
                  flush=True)
            checkpoint.os = KillingOs(
                budget, f"killer: SIGKILL inside the write of checkpoint {step}")
        return real_save(directory, at, payload, suffix, meta, keep)

    checkpoint.save = save

sys.argv = [example, *args]
runpy.run_path(example, run_name="__main__")
