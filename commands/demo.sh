#!/usr/bin/env bash
# The whole pipeline on generated sample videos with the default profile (profiles/local_cpu.yaml):
# what `make demo` runs. Each stage reads the previous stage's output directory.
#   usage: commands/demo.sh [OUT_DIR]      (default runs/demo)
set -euo pipefail
OUT=${1:-runs/demo}
PY=${PYTHON:-.venv/bin/python}
VF=${VIDFORGE:-.venv/bin/vidforge}
mkdir -p "$OUT"

echo "== sample videos -> $OUT/raw"
"$PY" examples/make_sample_videos.py "$OUT/raw"

echo "== profile"
"$VF" profile validate
