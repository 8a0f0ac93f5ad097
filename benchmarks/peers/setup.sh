#!/usr/bin/env bash
# Installs what the peers' benchmarks need into the interpreter PYTHON (default python3), each
# piece only when missing: torch's CPU build (as PyTorch documents it), Open MPI (Debian's
# openmpi-bin, as root or through sudo) and mpi4py. Usage: bash benchmarks/peers/setup.sh [PYTHON]
# For a separate environment: python3 -m venv /tmp/peers && bash benchmarks/peers/setup.sh /tmp/peers/bin/python
set -euo pipefail
PY=${1:-${PYTHON:-python3}}
has() { "$PY" -c "import $1" 2>/dev/null; }
has numpy || "$PY" -m pip install -q numpy
has torch || "$PY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
if ! command -v mpirun >/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev
fi
has mpi4py || "$PY" -m pip install -q mpi4py
"$PY" -c "import torch, mpi4py; print('peers ready: torch', torch.__version__, '- mpi4py', mpi4py.__version__)"
