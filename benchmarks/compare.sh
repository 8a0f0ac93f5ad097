#!/usr/bin/env bash
# Reruns the comparison of README and docs/figures.md from a fresh clone: sets the peers up
# (benchmarks/peers/setup.sh), then runs npusim, torch gloo and Open MPI interleaved and writes
# docs/figures.json and the page rendered from it, docs/figures.md (~10 minutes on 2 cores).
# Usage: bash benchmarks/compare.sh [python -m benchmarks.compare options, e.g. --rounds 1]
# FIGURES_DIR=DIR writes the two files there instead of docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import hccl, launcher" 2>/dev/null || "$PY" -m pip install -q -e .
bash benchmarks/peers/setup.sh "$PY"
OUT=${FIGURES_DIR:-docs}
"$PY" -m benchmarks.compare --json "$OUT/figures.json" --page "$OUT/figures.md" "$@"
