"""Quality against cost of the fast-sampling options (issue: videos in seconds) on the demo's own model and
prompts: the rows of docs/benchmarks.md's "Quality against cost" table.

Samples the demo's six videos (its three prompts, twice, as commands/demo.sh does) once per option and
prints, per option: the model calls a video took (and how many step caching skipped), the rows each call
ran (2 under classifier-free guidance, whose branches run as one doubled batch), the self- and
cross-attention FLOPs a video cost (`vidforge.models.flops`, sliding-tile windows counted; cached calls
cost nothing), the prompt check the demo test holds the samples to (`vidforge.bench.prompt_track`:
visible >= 0.6 and travel >= 0.08), the mean and largest pixel difference from the first option's videos,
and the `vidforge infer` command's CPU and wall seconds (model load and MP4 writing included).

The options: the teacher as trained (its own sampler and steps); step caching (`infer.cache.threshold`
at each of --thresholds); sliding-tile attention over half the keys (the demo's 9 x 8 x 12 token
grid in 3 x 4 x 4 tiles, a 3 x 1 x 3 window: training-free); the teacher's sampler at --steps; and a
distilled student (`--student`, sampled in its own few steps, unguided) where one is given. --option
adds any other: `LABEL=--set a=b --set c=d` on the teacher.

    OMP_NUM_THREADS=1 python bench/quality_cost.py --teacher runs/demo/train --out /tmp/quality_cost \\
        [--student runs/student] [--thresholds 0.2 0.4] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vidforge.bench.prompt_track import decode, track
from vidforge.infer.weights import find_weights, sampling_profile
from vidforge.models.flops import forward_flops
from vidforge.sampling.shape import check_shape
from vidforge.tokenizers import build_tokenizer

PROMPTS = ("a red square moving right", "a green square moving right", "a white square moving down")
MIN_VISIBLE, MIN_TRAVEL = 0.6, 0.08  # tests/e2e/test_demo.py's check
HALF_THE_KEYS = ("model.attention_tile=[3,4,4]", "model.attention_window=[3,1,3]")


@dataclass(frozen=True)
class Option:
    label: str
    checkpoint: str
    sets: tuple[str, ...] = ()


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def attention_flops_per_call(option: Option) -> tuple[int, int]:
    """(attention FLOPs of one model call over one video's tokens, rows a call runs) under the option's
    profile: the latent grid infer samples, `bench.text_tokens` caption tokens."""
    profile = sampling_profile(find_weights(option.checkpoint), option.sets)
    _, t, h, w = check_shape(profile, build_tokenizer(profile))
    pt, ph, pw = profile.model.patch
    flops = forward_flops(profile.model, [(t // pt, h // ph, w // pw)], profile.bench.text_tokens)
    return flops.parts["attention"], 1 if profile.diffusion.guidance == 1.0 else 2


def options(args: argparse.Namespace) -> list[Option]:
    teacher = args.teacher
    out = [Option("teacher, as trained", teacher)]
    out += [Option(f"step cache {t:g}", teacher, (f"infer.cache.threshold={t}",)) for t in args.thresholds]
    out.append(Option("sliding-tile, half the keys", teacher, HALF_THE_KEYS))
    out += [Option(f"teacher, {n} steps", teacher, (f"diffusion.steps={n}",)) for n in args.steps]
    if args.student:
        out.append(Option("student (few-step)", args.student))
    for text in args.option:
        label, _, sets = text.partition("=")
        words = shlex.split(sets)
        out.append(Option(label.strip(), teacher, tuple(w for w in words if w != "--set")))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="a trained demo run (runs/demo/train) or its export")
    ap.add_argument("--student", help="a student distilled from it (vidforge train with train.distill)")
    ap.add_argument("--out", required=True, help="folder for the samples (replaced)")
    ap.add_argument("--thresholds", type=float, nargs="*", default=[0.2, 0.4], help="step-caching thresholds")
    ap.add_argument("--steps", type=int, nargs="*", default=[4], help="the teacher's sampler at fewer steps")
    ap.add_argument("--option", action="append", default=[], help="'LABEL=--set a=b ...' on the teacher")
    args = ap.parse_args(argv)

    vf = str(Path(sys.executable).with_name("vidforge"))
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    prompts = [a for p in PROMPTS * 2 for a in ("--prompt", p)]
    reference: list[np.ndarray] | None = None
    print(
        f"{'option':<34} calls/video  skipped  rows/call  attention GFLOP/video  prompt check  "
        "mean visible  mean travel  |diff| vs first (mean / max)  infer CPU s  infer wall s"
    )
    for i, option in enumerate(options(args)):
        folder = out / f"{i:02d}"
        sets = [a for s in option.sets for a in ("--set", s)]
        cmd = [vf, "--json", "infer", "-c", option.checkpoint, "-o", str(folder), *prompts, *sets]
        before, start = _cpu_seconds(), time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"{shlex.join(cmd)}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        cpu = _cpu_seconds() - before
        records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
        videos = [decode(folder / r["video"]) for r in records]
        tracks = [track(frames, r["prompt"]) for r, frames in zip(records, videos, strict=True)]
        passed = sum(tr.visible >= MIN_VISIBLE and tr.travel >= MIN_TRAVEL for tr in tracks)
        visible, travel = np.mean([t.visible for t in tracks]), np.mean([t.travel for t in tracks])
        if reference is None:
            reference = videos
        diffs = [np.abs(a.astype(int) - b.astype(int)) for a, b in zip(videos, reference, strict=True)]
        diff = f"{np.mean([d.mean() for d in diffs]):.1f} / {max(int(d.max()) for d in diffs)}"
        calls = float(np.mean([r["model_calls"] for r in records]))
        skipped = float(np.mean([r["skipped_calls"] for r in records]))
        per_call, rows = attention_flops_per_call(option)
        gflop = (calls - skipped) * rows * per_call / 1e9
        print(
            f"{option.label:<34} {calls:11.1f}  {skipped:7.1f}  {rows:9d}  {gflop:20.2f}  "
            f"{passed:>10}/{len(records)}  {visible:12.2f}  {travel:+11.2f}  {diff:>28}  {cpu:11.1f}  {wall:12.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
