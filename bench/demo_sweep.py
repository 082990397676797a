"""One configuration of the demo's train + infer, scored by the prompt tracker: a row of the demo sweep in
docs/benchmarks.md. Trains on latent shards the demo wrote (commands/demo.sh up to tokenize), samples the
demo's prompts at each seed, and prints, per prompt and seed, the fraction of frames holding the named
colour and the blob's travel the named way (fraction of the frame), with train and infer CPU seconds.
On a shared machine set OMP_NUM_THREADS=1: torch's two threads spinning against other processes made a
step about 15x slower here (docs/benchmarks.md).

    OMP_NUM_THREADS=1 python bench/demo_sweep.py --data runs/demo/latents --out /tmp/sweep/flow --steps 1500 --seeds 0 1 \\
        --set diffusion.objective=flow
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

from vidforge.bench.prompt_track import decode, track

PROMPTS = ("a red square moving right", "a green square moving right", "a white square moving down")


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str]) -> float:
    """Run a command; its user+sys CPU seconds (the machine is shared, so wall-clock says little)."""
    before = _cpu_seconds()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return _cpu_seconds() - before


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="latent shards (the demo's OUT/latents)")
    ap.add_argument("--out", required=True, help="folder for the run and the samples (replaced)")
    ap.add_argument("--steps", type=int, default=1500, help="training steps")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="sampling seeds")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="profile override, for train")
    ap.add_argument("--infer-set", action="append", default=[], help="profile override, for infer only")
    args = ap.parse_args(argv)

    vf = str(Path(sys.executable).with_name("vidforge"))
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    sets = [a for s in args.sets for a in ("--set", s)]
    train_cmd = [vf, "--quiet", "train", "--data", args.data, "--run-dir", str(out / "train"), *sets]
    train_cmd += ["--set", f"train.steps={args.steps}", "--set", f"train.save_every={args.steps}"]
    t0 = time.time()
    train_cpu = _run(train_cmd)
    train_wall = time.time() - t0
    infer_sets = [a for s in args.infer_set for a in ("--set", s)]
    rows, infer_cpu = [], 0.0
    for seed in args.seeds:
        samples = out / f"samples_seed{seed}"
        cmd = [vf, "--quiet", "infer", "-c", str(out / "train"), "-o", str(samples), "--seed", str(seed)]
        infer_cpu += _run([*cmd, *[a for p in PROMPTS for a in ("--prompt", p)], *infer_sets])
        for line in (samples / "samples.jsonl").read_text().splitlines():
            rec = json.loads(line)
            tr = track(decode(samples / Path(rec["video"]).name), rec["prompt"])
            rows.append((seed, rec["prompt"], tr))
    print(f"config: {' '.join(args.sets + args.infer_set) or '(profile defaults)'}  steps={args.steps}")
    print(f"train: {train_cpu:.0f} CPU s ({train_wall:.0f} s wall)  infer: {infer_cpu:.0f} CPU s")
    print(f"{'seed':>4}  {'prompt':<30} {'visible':>7} {'travel':>7}")
    for seed, prompt, tr in rows:
        print(f"{seed:>4}  {prompt:<30} {tr.visible:>7.2f} {tr.travel:>+7.2f}")
    worst = min(min(tr.visible, tr.travel) for _, _, tr in rows)
    print(f"worst of visible/travel: {worst:+.2f}")


if __name__ == "__main__":
    main()
