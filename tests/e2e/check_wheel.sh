#!/usr/bin/env bash
# The wheel as a package index (or `pip install .`) installs npusim, checked from outside the
# checkout (issue 53): build the wheel from a clean copy of the checkout, install it (not
# editable) with its dependencies into a fresh venv, then
#   1. every file of runtime/, hccl/, launcher/, torch_npu/ is in the installed package, and
#      `import` finds the installed copy (the checkout is not on sys.path);
#   2. README's quickstart job: npurun --nproc-per-node 4 examples/train_ddp.py --check;
#   3. a torch smoke: torch's CPU build added (the pin takes /opt/wheels' file, no download), an
#      npu tensor on each of 2 ranks, all_reduce over the "hccl" backend, checked numbers.
# Run by .ci/run; by hand: tests/e2e/check_wheel.sh (exit 0: all passed). Measured on the 2-core
# machine: about a minute idle (59 s: 24 s the quickstart, 22 s installing torch), 2.5 min at
# load average 9.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH     # only the installed package may be found
work=$(mktemp -d /tmp/npusim-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
say() { echo "check_wheel: $*"; }
t0=$(date +%s)

# a clean copy: the checkout's files (tracked and new, not ignored), never its build/ or egg-info
mkdir "$work/src"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard) \
    | (cd "$root" && xargs -0 tar -cf - --no-recursion --ignore-failed-read 2>/dev/null) \
    | tar -xf - -C "$work/src"
else
  tar -C "$root" --exclude=.git --exclude=build --exclude='*.egg-info' -cf - . | tar -xf - -C "$work/src"
fi
python3 -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
python -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work/dist"/npusim-*.whl)
say "built $(basename "$wheel") in $(( $(date +%s) - t0 )) s"
python -m pip install -q "$wheel"

mkdir "$work/run"
cd "$work/run"      # outside the checkout: only the installed package can be imported
python - "$work/src" <<'EOF'
import importlib, os, sys
root = sys.argv[1]     # the clean copy: every file of the packages must be installed (a folder
site = os.path.realpath(os.path.join(sys.prefix, "lib"))    # without __init__.py, data files)
missing, outside = [], []
for pkg in ("runtime", "hccl", "launcher", "torch_npu"):
    for d, _dirs, files in os.walk(os.path.join(root, pkg)):
        if "__pycache__" in d:
            continue
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root)
            if not any(os.path.exists(os.path.join(p, rel)) for p in sys.path if p):
                missing.append(rel)
for name in ("runtime", "hccl", "launcher"):    # the torch parts: in the smoke below
    mod = importlib.import_module(name)
    if not os.path.realpath(mod.__file__).startswith(site):
        outside.append(f"{name} from {mod.__file__}")
if missing or outside:
    sys.exit("check_wheel: the installed package lacks " + ", ".join(missing)
             + ("; imported outside the venv: " + ", ".join(outside) if outside else ""))
print(f"check_wheel: every file of the checkout's packages is installed in {site}")
EOF
command -v npurun >/dev/null || { say "no npurun script in the venv"; exit 1; }
t1=$(date +%s)
npurun --nproc-per-node 4 "$root/examples/train_ddp.py" --check > quickstart.log 2>&1 || {
  cat quickstart.log; say "the quickstart job failed"; exit 1; }
grep -q "CHECK PASS" quickstart.log || {
  cat quickstart.log; say "the quickstart job did not report its check"; exit 1; }
say "quickstart job (4 ranks, --check) passed in $(( $(date +%s) - t1 )) s"

t2=$(date +%s)
python -m pip install -q --no-compile 'torch==2.13.0'   # no .pyc of torch's 20k files: a smoke
say "torch installed in $(( $(date +%s) - t2 )) s"
cat > smoke.py <<'EOF'
import os

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401  (npusim's: the npu device)

import hccl

local = int(os.environ["LOCAL_RANK"])
torch.npu.set_device(local)
dist.init_process_group(backend="hccl")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.arange(4, dtype=torch.float32, device=f"npu:{local}") * (rank + 1)
assert x.device.type == "npu", x.device
dist.all_reduce(x)
want = [float(i * world * (world + 1) // 2) for i in range(4)]
got = x.cpu().tolist()
assert got == want, (got, want)
assert dist.get_backend() == "hccl", dist.get_backend()
import hccl.torch
print(f"smoke rank {rank}/{world}: all_reduce on {x.device} -> {got}; "
      f"from {hccl.torch.__file__} and {torch_npu.__file__}")
dist.destroy_process_group()
EOF
t3=$(date +%s)
npurun --nproc-per-node 2 smoke.py > smoke.log 2>&1 || { cat smoke.log; say "the torch smoke failed"; exit 1; }
cat smoke.log
[ "$(grep -c 'smoke rank' smoke.log)" -eq 2 ] || { say "the torch smoke did not print both ranks"; exit 1; }
[ "$(grep -c "from $work/venv/.*/site-packages/hccl/torch/__init__.py and $work/venv/.*/site-packages/torch_npu/__init__.py" smoke.log)" -eq 2 ] \
  || { say "the smoke ran hccl.torch or torch_npu from outside the venv"; exit 1; }
say "torch smoke (npu tensors, hccl backend, world 2) passed in $(( $(date +%s) - t3 )) s"
say "all passed in $(( $(date +%s) - t0 )) s"
