"""The GPU suite: every GPU check and measurement of vidforge in one command, each measurement beside
its anchor from the same run, written as one JSON file and one markdown table.

    python bench/gpu/suite.py --out OUT [--only attention,train] [--cpu-smoke]

On a GPU machine it runs the steps of `STEPS` at the issue's shapes (bench/gpu/shapes.py: GPU); with
--cpu-smoke the same steps run at tiny shapes on the CPU, so CI runs the whole driver. Training,
sampling and the benchmarks run through the `vidforge` command line in subprocesses (a step that runs
out of memory or crashes costs its own rows, not the suite); the diffusers peer and the caption models
run in their own processes too. A step that fails becomes a row saying why, and the suite goes on:
the first device run should bring back everything it can.

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

import measure_steps as m  # noqa: E402
from report import Context, Row, markdown  # noqa: E402
from shapes import GPU, SMOKE  # noqa: E402

# name -> (function, what it covers), in run order: the cheap checks first, so a device run that runs
# out of time still brings back the correctness rows.
STEPS = {
    "correctness": (m.correctness, "pytest -m gpu: CUDA paths against float32 or the CPU"),
    "attention": (m.attention, "TFLOP/s of each attention backend"),
    "train": (m.train, "1.3B training step, eager and compiled, beside diffusers' Wan"),
    "infer": (m.infer, "guided sampling step beside diffusers' Wan"),
    "memory": (m.memory, "memory model against torch.cuda.max_memory_allocated"),
    "offload": (m.offload, "activation offload's step time and peak beside keeping activations"),
    "tokenize": (m.tokenize, "vidforge tokenize against the VAE's own encode"),
    "caption": (m.caption, "caption models' clips/s"),
}
STEP_NAMES = tuple(STEPS)


def device_name(smoke: bool) -> str:
    if smoke:
        return f"CPU smoke run ({platform.machine()}, {os.cpu_count()} cores)"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"


def accelerator_for(name: str) -> str:
    """The profile's accelerator (its peak FLOP/s is the MFU denominator) for a CUDA device name."""
    return "h200" if "H200" in name else "h100"


def run(out: Path, only: list[str], smoke: bool, log=print) -> dict:
    """Run the steps `only` and write gpu_suite.json and gpu_suite.md to `out`, after every step: a
    device command stopped at its time limit still leaves the rows of the steps it finished. Scratch
    data goes to a temporary folder, so `out` holds the two files alone (what comes back from a device
    call is a few files)."""
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
        "step_seconds": {},
        "seconds": 0.0,
        "rows": [],
        "tracebacks": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vidforge-gpu-suite-") as tmp:
        ctx = Context(shapes=shapes, work=Path(tmp), smoke=smoke, env=env)
        for name in only:
            fn, _ = STEPS[name]
            log(f"[gpu-suite] {name} ...")
            t0 = time.perf_counter()
            step_dir = ctx.work / name
            step_dir.mkdir(parents=True, exist_ok=True)
            try:
                got = fn(ctx, step_dir)
            except Exception as err:  # a failed step is a row: the run goes on and says what broke
                report["tracebacks"][name] = traceback.format_exc()
                got = [Row(name, "step failed", None, note=f"{type(err).__name__}: {str(err).strip()[:300]}")]
            report["step_seconds"][name] = time.perf_counter() - t0
            rows.extend(got)
            log(f"[gpu-suite] {name}: {len(got)} row(s) in {report['step_seconds'][name]:.1f} s")
            report["seconds"] = time.perf_counter() - started
            report["rows"] = [{**asdict(r), "ratio": r.ratio} for r in rows]
            (out / "gpu_suite.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
            (out / "gpu_suite.md").write_text(markdown(report))
    return report


def parse_only(value: str | None) -> list[str]:
    if not value:
        return list(STEP_NAMES)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in STEP_NAMES]
    if unknown:
        raise ValueError(f"--only: unknown step(s) {', '.join(unknown)}; use some of {', '.join(STEP_NAMES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu-suite"))
    steps = "; ".join(f"{name}: {what}" for name, (_, what) in STEPS.items())
    ap.add_argument("--only", help=f"comma-separated steps (default all, in this order) - {steps}")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (what CI runs)")
    args = ap.parse_args(argv)
    try:
        only = parse_only(args.only)
        if not args.cpu_smoke:
            import torch

            if not torch.cuda.is_available():
                raise ValueError("no CUDA device is visible: run on a GPU machine, or pass --cpu-smoke")
    except ValueError as err:  # what to change, on one line; exit 2 as vidforge's user errors
        print(f"error: {err}", file=sys.stderr)
        return 2
    report = run(args.out, only, args.cpu_smoke)
    print(markdown(report))
    print(f"wrote {args.out / 'gpu_suite.json'} and {args.out / 'gpu_suite.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
