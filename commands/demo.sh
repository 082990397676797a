#!/usr/bin/env bash
# The whole pipeline on generated sample videos with the default profile (local_cpu: pixel tokenizer,
# tiny DiT, CPU, no downloaded weights): what `make demo` runs. Each stage reads the previous stage's
# output directory, and every stage resumes, so running it again only redoes what is missing.
#
#   usage: commands/demo.sh [OUT_DIR]              (default runs/demo)
#   env:   TRAIN_STEPS=N  shorter training (commands/ci-smoke.sh uses it); PYTHON, VIDFORGE: the tools
#
# Every prompt is sampled twice (seeds 0-2 and 3-5), so the contact sheet shows two draws of each.
set -euo pipefail
OUT=${1:-runs/demo}
PY=${PYTHON:-.venv/bin/python}
VF=${VIDFORGE:-.venv/bin/vidforge}
PROMPTS=("a red square moving right" "a green square moving right" "a white square moving down")
mkdir -p "$OUT"

# Exit code 3 means "finished, some inputs rejected": fine for a demo, anything else stops it.
stage() { local name=$1; shift; echo "== $name"; "$@" || { rc=$?; [ "$rc" -eq 3 ] || exit "$rc"; }; }

# 32 training videos for each prompt beside the catalogue's: a square of the named colour entering from
# the side it comes from and crossing a third of the frame or more (make_sample_videos.py, demo_scenes).
# 32 rather than 16: the catalogue's few clips (a green background, a red square on blue) then pull the
# samples less often (docs/benchmarks.md, Demo sweep).
stage "sample videos -> $OUT/raw" "$PY" examples/make_sample_videos.py "$OUT/raw" --demo 32
stage "clip" "$VF" clip "$OUT/raw" -o "$OUT/clips"
stage "caption" "$VF" caption "$OUT/clips" -o "$OUT/captioned"
stage "shard" "$VF" shard "$OUT/captioned" -o "$OUT/shards"
# The demo's settings on top of the default profile (which other recipes and tests keep as it is), for
# tokenize and train; infer reads them from the run's exported profile. Each was measured against what
# it replaced (docs/benchmarks.md, Demo sweep):
# - one frame a latent frame (4x4 pixels x 3 colours = 48 channels a token): with four frames packed in a
#   token the tiny model drew speckle where the square should be;
# - rectified flow predicting the clean latents (Li & He 2025): predicting the velocity, or EDM, it left
#   the samples as grainy as the noise they started from;
# - the caption also in every adaLN modulation (model.text_pool): through cross-attention alone, the
#   model drew every prompt white at some training seeds.
DEMO=(--set tokenizer.temporal_compression=1 --set model.in_channels=48 --set model.text_pool=true
  --set diffusion.objective=flow --set diffusion.flow_prediction=clean)
stage "tokenize" "$VF" tokenize "$OUT/shards" -o "$OUT/latents" "${DEMO[@]}"
# 3000 training steps at lr 2e-3, on one thread: 0.147 s a step on an idle 2-core machine, where torch's
# two threads took 0.167 (the data loader's prefetch thread wants the other core). About 7.5 minutes,
# the whole demo about 8.5: what the demo test affords in CI.
train_args=(--data "$OUT/latents" --run-dir "$OUT/train" --resume "${DEMO[@]}"
  --set train.lr=0.002 --set train.steps=3000)
[ -n "${TRAIN_STEPS:-}" ] && train_args+=(--set "train.steps=$TRAIN_STEPS" --set train.warmup_steps=1)
stage "train" env OMP_NUM_THREADS=1 "$VF" train "${train_args[@]}"
infer_args=(-c "$OUT/train" -o "$OUT/samples")
for _ in 1 2; do for p in "${PROMPTS[@]}"; do infer_args+=(--prompt "$p"); done; done
stage "infer" "$VF" infer "${infer_args[@]}"
for run in captioned train samples; do stage "review $run" "$VF" review "$OUT/$run"; done

echo
echo "videos:        $OUT/samples/*.mp4"
echo "contact sheet: $OUT/samples/contact_sheet.png"
echo "metrics:       $OUT/train/metrics.jsonl"
echo "review pages:  $OUT/{captioned,train,samples}/review/index.html (open in a browser, no server)"
