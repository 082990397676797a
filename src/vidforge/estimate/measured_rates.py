"""What `bench plan`'s step times are computed at: the GPU suite's last measured step on the accelerator
at hand, not an assumed efficiency.

The suite measures the Wan 1.3B training step beside diffusers' (bench/gpu/, docs/gpu-runs/). Its MFU
counts the model's FLOPs; the plan divides the hardware FLOPs of the step it predicts (with its own
recompute) by a rate, so the rate taken here is the measured step's hardware FLOPs per second: its MFU x
the ratio of its hardware FLOPs (full recompute: every block's forward again) to its model FLOPs, counted
by `vidforge.models.flops` at the measured shape. A `bench.achievable_mfu` the user sets wins; an
accelerator the suite has not run on keeps bench.achievable_mfu's default, and the plan says which."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vidforge.profile import RunProfile


@dataclass(frozen=True)
class MeasuredStep:
    """One GPU suite measurement of the 1.3B training step (the train pair's row)."""

    source: str
    """Where the number is written down: the run's folder under docs/gpu-runs and its row."""
    preset: str
    latent: tuple[int, int, int]
    text_tokens: int
    recompute_fraction: float
    mfu_eager: float
    mfu_compiled: float
    matmul_tflops: float
    """The dense bf16 matmul rate of the same device and run (the suite's attention anchor)."""
    attention_tflops: float
    """cuDNN attention forward + backward at 32,760 tokens, the same run."""


MEASURED: dict[str, MeasuredStep] = {
    "h200": MeasuredStep(
        source="docs/gpu-runs/2026-11-26-h200-session10 (docs/benchmarks.md, Second GPU run)",
        preset="wan2.1-1.3b",
        latent=(21, 60, 104),
        text_tokens=512,
        recompute_fraction=1.0,
        mfu_eager=0.288,
        mfu_compiled=0.355,
        matmul_tflops=751.0,
        attention_tflops=455.0,
    ),
}


@functools.cache
def _hardware_over_model(step: MeasuredStep) -> float:
    """Hardware FLOPs over model FLOPs of the measured step (its recompute's share)."""
    from vidforge.models.flops import forward_flops
    from vidforge.profile.model import Model

    cfg = Model.model_validate({"preset": step.preset})
    t, h, w = step.latent
    p = cfg.patch
    count = forward_flops(cfg, [(t // p[0], h // p[1], w // p[2])], step.text_tokens)
    return count.train_step(step.recompute_fraction) / count.train_step(0.0)


def achievable_mfu(profile: RunProfile) -> tuple[float, str]:
    """The share of the accelerator's peak that the step's hardware FLOPs run at, and where it comes from
    (the plan prints it)."""
    bench, accelerator = profile.bench, profile.cluster.accelerator
    if "achievable_mfu" in bench.model_fields_set:
        return bench.achievable_mfu, "bench.achievable_mfu as set"
    step = MEASURED.get(accelerator.name)
    if step is None:
        return bench.achievable_mfu, f"assumed (bench.achievable_mfu; no GPU suite run on {accelerator.name})"
    compiled = profile.train.compile
    mfu = step.mfu_compiled if compiled else step.mfu_eager
    rate = mfu * _hardware_over_model(step)
    how = "compiled" if compiled else "eager"
    return (
        rate,
        f"measured: the {step.preset} step {how} (MFU {mfu:.1%}, {rate:.1%} with its recompute), {step.source}",
    )
