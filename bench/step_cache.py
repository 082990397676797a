"""Step caching (infer.cache) on the demo's model and prompts: the rows of docs/benchmarks.md's Step
caching table. Samples the demo's six videos (its three prompts, twice, as commands/demo.sh does) from a
trained demo run at each threshold, and prints, per threshold, the model calls a video took, how many
step caching skipped, the prompt check the demo test holds the samples to (vidforge.bench.prompt_track:
visible >= 0.6 and travel >= 0.08), the videos' mean and largest pixel difference from the uncached ones
(threshold 0 first), and the infer command's CPU and wall seconds (model load and MP4 writing included). With a distilled
student as --checkpoint and threshold 0 it samples the student in its own few steps. The demo model's first-block input moves 8-46%
a call (unipc, 32 steps), so thresholds that skip anything there are larger than TeaCache's for Wan.

    OMP_NUM_THREADS=1 python bench/step_cache.py --checkpoint runs/demo/train --out /tmp/step_cache \\
        --thresholds 0 0.2 0.4 0.6 1.0
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vidforge.bench.prompt_track import decode, track

PROMPTS = ("a red square moving right", "a green square moving right", "a white square moving down")
MIN_VISIBLE, MIN_TRAVEL = 0.6, 0.08  # tests/e2e/test_demo.py's check


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a trained demo run (runs/demo/train)")
    ap.add_argument("--out", required=True, help="folder for the samples (replaced)")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0, 0.2, 0.4, 0.6, 1.0])
    ap.add_argument("--set", dest="sets", action="append", default=[], help="profile override for infer")
    args = ap.parse_args(argv)

    vf = str(Path(sys.executable).with_name("vidforge"))
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    prompts = [a for p in PROMPTS * 2 for a in ("--prompt", p)]
    sets = [a for s in args.sets for a in ("--set", s)]
    reference: list[np.ndarray] | None = None
    print(
        "threshold  calls/video  skipped/video  prompt check  mean visible  mean travel  "
        "|diff| vs uncached (mean / max)  infer CPU s  infer wall s"
    )
    for threshold in sorted(set(args.thresholds)):
        folder = out / f"t{threshold:g}"
        cmd = [vf, "--json", "infer", "-c", args.checkpoint, "-o", str(folder), *prompts, *sets]
        cmd += ["--set", f"infer.cache.threshold={threshold}"]
        before, start = _cpu_seconds(), time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
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
        calls = np.mean([r["model_calls"] for r in records])
        skipped = np.mean([r["skipped_calls"] for r in records])
        print(
            f"{threshold:9g}  {calls:11.1f}  {skipped:13.1f}  {passed:>10}/{len(records)}  {visible:12.2f}  "
            f"{travel:+11.2f}  {diff:>31}  {cpu:11.1f}  {wall:12.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
