#!/usr/bin/env bash
# A CI smoke run: the whole demo pipeline with a few training steps, checking that every stage runs
# and writes its output. It does not judge sample quality (the demo test does).
#   usage: commands/ci-smoke.sh [OUT_DIR]          (default runs/ci-smoke)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/ci-smoke}
TRAIN_STEPS=${TRAIN_STEPS:-20} bash commands/demo.sh "$OUT"
for f in "$OUT/clips/manifest.jsonl" "$OUT/captioned/manifest.jsonl" "$OUT/shards/index.json" \
         "$OUT/latents/index.json" "$OUT/train/export/model.safetensors" "$OUT/samples/contact_sheet.png" \
         "$OUT/captioned/review/index.html" "$OUT/train/review/index.html" "$OUT/samples/review/index.html"; do
  [ -s "$f" ] || { echo "ci-smoke: missing $f" >&2; exit 1; }
done
echo "ci-smoke: ok"
