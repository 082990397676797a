"""The GPU suite: every GPU check and measurement of vidforge in one command, each measurement beside
its anchor from the same run, written as one JSON file and one markdown table.

    python bench/gpu/suite.py --out OUT [--part headline|rest | --only attention,train_eager]
                              [--deadline-s S] [--cpu-smoke]

On a GPU machine it runs the steps of `STEPS` at the issue's shapes (bench/gpu/shapes.py: GPU); with
--cpu-smoke the same steps run at tiny shapes on the CPU, so CI runs the whole driver. Training,
sampling and the benchmarks run through the `vidforge` command line in subprocesses (a step that runs
out of memory or crashes costs its own rows, not the suite); the diffusers peer and the caption models
run in their own processes too. A step that fails becomes a row saying why, and the suite goes on:
the first device run should bring back everything it can. The files are rewritten after every row
(the train pair after each mode, the correctness step after each test), so a device command stopped at
its limit keeps everything that finished.

A device command runs at most 10 minutes and a session has 15 in all, so the suite comes in two PARTS,
each one device command: `headline` (the train pair eager and compiled, the infer pair, memory against
the memory model, the CUDA correctness tests) and `rest` (SDPA kernels, attention TFLOP/s, offload,
tokenize, caption), each writing gpu_suite-PART.json and .md. Each part has a time budget counted from
run.sh's start (VIDFORGE_GPU_SUITE_T0), so the offline install is inside it: a step that would start
after it is a row saying so, and a step's subprocesses get only the time left.

`bench/gpu/run.sh` is the device-side entry (offline install of the gathered wheels, then this).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ahead_steps as a  # noqa: E402
import curate_steps as c  # noqa: E402
import measure_steps as m  # noqa: E402
from report import Context, Row, markdown  # noqa: E402
from shapes import GPU, SMOKE  # noqa: E402

# name -> (function, what it covers), in run order: the cheap checks first, so a device run that runs
# out of time still brings back the correctness rows.
STEPS = {
    "train_eager": (m.train_eager, "1.3B training step beside diffusers' Wan, eager"),
    "infer": (m.infer, "guided sampling step (the objective's sampler) beside diffusers' Wan"),
    "train_compiled": (m.train_compiled, "the same pair with train.compile / compiled blocks"),
    "memory": (m.memory, "memory model against torch.cuda.max_memory_allocated"),
    "correctness": (m.correctness, "pytest -m gpu: CUDA paths against float32 or the CPU, test by test"),
    "sdpa_kernels": (m.sdpa_kernels, "the SDPA implementation and kernel of each attention call"),
    "attention": (m.attention, "TFLOP/s of each attention backend"),
    "offload": (m.offload, "activation offload's step time and peak beside keeping activations"),
    "tokenize": (m.tokenize, "vidforge tokenize against the VAE's own encode"),
    "caption": (m.caption, "caption models' clips/s"),
    "train_auto": (
        a.train_auto,
        "1.3B step with auto recompute beside diffusers' compiled full-recompute step",
    ),
    "stack_14b": (
        a.stack_14b,
        "14B-width block stack: TFLOP/s per GPU against Megatron's; float8 against bf16",
    ),
    "distill": (a.distill, "a distilled student's seconds per video against its teacher's"),
    "fp8_compile": (a.fp8_compile, "the CUDA check [fp8+compile], on its own"),
    "wan22": (
        a.wan22,
        "Wan2.2 TI2V-5B and Wan2.1-I2V-14B LoRA steps at published shapes against the planner",
    ),
    "sparse": (a.sparse, "sliding-tile and video sparse attention (flex) against the dense step"),
    "swap_offload": (a.swap_offload, "block swap and checkpoint offload against the planner's prediction"),
    "split_embed": (
        c.split_embed,
        "vidforge clip's clips/s (NVDEC and CPU decode) against Curator's minimum",
    ),
}
STEP_NAMES = tuple(STEPS)

# name -> (steps, the device command's time budget in seconds, run.sh's offline install included).
# From the first H200 run (2026-11-26: train eager 87 s, infer 122 s with four sampler pairs where one
# now runs, train compiled 101 s, pytest of tests/gpu 192 s in one process, now four), for device
# commands of 8 and 6 minutes with 30 s to spare: docs/developer.md, "The GPU suite", gives the command lines.
# Issue 48's rows do not fit beside them: two more parts, in the order of what their rows decide (whether
# vidforge is ahead of the peer and of Megatron first; then the paths never measured), each one device
# command of 6 minutes. Their times on the GPU are not measured yet (the compiled 1.3B pair took 101 s +
# the peer's in the first run): a step that would start after its part's budget is a row saying so.
PARTS: dict[str, tuple[tuple[str, ...], float]] = {
    "headline": (("train_eager", "infer", "train_compiled", "memory", "correctness"), 450.0),
    "rest": (("sdpa_kernels", "attention", "offload", "tokenize", "caption"), 330.0),
    "ahead": (("train_auto", "stack_14b", "fp8_compile", "distill"), 330.0),
    "unmeasured": (("wan22", "sparse", "swap_offload"), 330.0),
    # Issue 49's curation row: 720p footage generated on the device (~30 s), two clip runs.
    "curation": (("split_embed",), 240.0),
}


def device_name(smoke: bool) -> str:
    if smoke:
        return f"CPU smoke run ({platform.machine()}, {os.cpu_count()} cores)"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"


def default_out(smoke: bool) -> str:
    """docs/gpu-runs/DATE-ACCELERATOR: each run's raw files in the repository, beside the table that
    docs/benchmarks.md quotes (a device call's $OUT comes back and is copied there)."""
    if smoke:
        return "runs/gpu-suite"
    return f"docs/gpu-runs/{time.strftime('%Y-%m-%d', time.gmtime())}-{accelerator_for(device_name(False))}"


def accelerator_for(name: str) -> str:
    """The profile's accelerator (its peak FLOP/s is the MFU denominator) for a CUDA device name."""
    return "h200" if "H200" in name else "h100"


def run(
    out: Path,
    only: list[str],
    smoke: bool,
    log=print,
    deadline_s: float | None = None,
    name: str = "gpu_suite",
) -> dict:
    """Run the steps `only` and write NAME.json and NAME.md to `out` after every row: a device command
    stopped at its time limit still leaves the rows that finished. With `deadline_s`, a step that would
    start later than that many seconds from now is a row saying so, and subprocesses get only the time
    left. Scratch data goes to a temporary folder, so `out` holds the two files and the correctness
    step's pytest.log alone (what comes back from a device call is a few files)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    device = device_name(smoke)
    shapes = SMOKE if smoke else replace(GPU, accelerator=accelerator_for(device))
    env = {**os.environ, "LOCAL_RANK": "0", "PYTHONUNBUFFERED": "1"}
    rows: list[Row] = []
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "smoke": smoke,
        "steps": only,
        "deadline_s": deadline_s,
        "step_seconds": {},
        "seconds": 0.0,
        "rows": [],
        "tracebacks": {},
    }
    started = time.perf_counter()

    def write() -> None:
        report["seconds"] = time.perf_counter() - started
        report["rows"] = [{**asdict(r), "ratio": r.ratio} for r in rows]
        (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (out / f"{name}.md").write_text(markdown(report))

    deadline = None if deadline_s is None else started + deadline_s
    with tempfile.TemporaryDirectory(prefix="vidforge-gpu-suite-") as tmp:
        ctx = Context(shapes=shapes, work=Path(tmp), smoke=smoke, env=env, deadline=deadline, out=out)
        for step in only:
            fn, _ = STEPS[step]
            if ctx.time_left(1.0) <= 0:
                rows.append(
                    Row(step, "not run", None, note=f"the time budget ({deadline_s:.0f} s) was spent")
                )
                write()
                continue
            log(f"[gpu-suite] {step} ...")
            t0 = time.perf_counter()
            step_dir = ctx.work / step
            step_dir.mkdir(parents=True, exist_ok=True)
            count = 0
            try:
                for row in fn(ctx, step_dir):
                    rows.append(row)
                    count += 1
                    report["step_seconds"][step] = time.perf_counter() - t0
                    write()
            except Exception as err:  # a failed step is a row: the run goes on and says what broke
                report["tracebacks"][step] = traceback.format_exc()
                rows.append(
                    Row(step, "step failed", None, note=f"{type(err).__name__}: {str(err).strip()[:300]}")
                )
                count += 1
            report["step_seconds"][step] = time.perf_counter() - t0
            write()
            log(f"[gpu-suite] {step}: {count} row(s) in {report['step_seconds'][step]:.1f} s")
    return report


def parse_only(value: str | None, part: str | None = None) -> list[str]:
    if part:
        if value:
            raise ValueError("--part and --only: give one of them")
        if part not in PARTS:
            raise ValueError(f"--part: unknown part {part}; use one of {', '.join(PARTS)}")
        return list(PARTS[part][0])
    if not value:
        return list(STEP_NAMES)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in STEP_NAMES]
    if unknown:
        raise ValueError(f"--only: unknown step(s) {', '.join(unknown)}; use some of {', '.join(STEP_NAMES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the JSON, table and pytest log go (default: $OUT on the device machine, else "
        "docs/gpu-runs/DATE-ACCELERATOR, the run's folder in the repository; smoke runs: runs/gpu-suite)",
    )
    steps = "; ".join(f"{name}: {what}" for name, (_, what) in STEPS.items())
    ap.add_argument("--only", help=f"comma-separated steps (default all, in this order) - {steps}")
    parts = "; ".join(f"{name}: {', '.join(steps)} (budget {s:.0f} s)" for name, (steps, s) in PARTS.items())
    ap.add_argument("--part", help=f"one device command's share of the steps - {parts}")
    ap.add_argument(
        "--deadline-s",
        type=float,
        help="the command's time budget, counted from run.sh's start (default: the part's on the GPU)",
    )
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (what CI runs)")
    args = ap.parse_args(argv)
    try:
        only = parse_only(args.only, args.part)
        if not args.cpu_smoke:
            import torch

            if not torch.cuda.is_available():
                raise ValueError("no CUDA device is visible: run on a GPU machine, or pass --cpu-smoke")
    except ValueError as err:  # what to change, on one line; exit 2 as vidforge's user errors
        print(f"error: {err}", file=sys.stderr)
        return 2
    deadline = args.deadline_s
    if deadline is None and args.part and not args.cpu_smoke:
        deadline = PARTS[args.part][1]
    if deadline is not None:  # the budget is the device command's: run.sh's install came out of it
        deadline -= time.time() - float(os.environ.get("VIDFORGE_GPU_SUITE_T0") or time.time())
    name = f"gpu_suite-{args.part}" if args.part else "gpu_suite"
    if args.out is None:
        args.out = Path(os.environ.get("OUT") or default_out(args.cpu_smoke))
    report = run(args.out, only, args.cpu_smoke, deadline_s=deadline, name=name)
    print(markdown(report))
    print(f"wrote {args.out / (name + '.json')} and {args.out / (name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
