"""Learning-rate schedule: linear warm-up, then cosine decay to a floor or constant."""

from __future__ import annotations

import math
from typing import Any

from vidforge.profile.train import Train

SCHEDULE_FIELDS = ("lr", "warmup_steps", "schedule", "min_lr_ratio", "steps")
"""The train fields that fix the learning rate at every step (what a checkpoint records as its schedule)."""


def lr_multiplier(step: int, cfg: Train) -> float:
    """The factor on cfg.lr for optimizer step `step` (0-based): 0 -> 1 over warm-up, then the schedule."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(cfg.steps - cfg.warmup_steps - 1, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    floor = cfg.min_lr_ratio
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rate(step: int, cfg: Train) -> float:
    return cfg.lr * lr_multiplier(step, cfg)


def schedule_state(cfg: Train) -> dict[str, Any]:
    """The schedule as JSON-able data, saved with each checkpoint."""
    return {name: getattr(cfg, name) for name in SCHEDULE_FIELDS}


def resumed_schedule(cfg: Train, saved: dict[str, Any] | None, step: int) -> tuple[Train, str | None]:
    """The Train whose schedule a run resumed at `step` follows, and one line when the profile's differs
    from the checkpoint's `saved` one. By default the run keeps its own schedule (more train.steps past
    the end of a cosine go on at its floor); train.resume_schedule=refit (--reschedule) fits the profile's
    schedule instead, from this step on. A checkpoint without a saved schedule follows the profile's."""
    if not saved:
        return cfg, None
    changed = [
        f"train.{k} {saved[k]} -> {getattr(cfg, k)}" for k in SCHEDULE_FIELDS if saved[k] != getattr(cfg, k)
    ]
    if not changed:
        return cfg, None
    kept = cfg.model_copy(update=saved)
    what = ", ".join(changed)
    if cfg.resume_schedule == "keep":
        return kept, (
            f"{what}: the run keeps its schedule (lr {learning_rate(step, kept):.2e} at step {step}); "
            "pass --reschedule to fit the new one from here"
        )
    return cfg, (
        f"{what}: schedule refitted (--reschedule): lr at step {step} "
        f"{learning_rate(step, kept):.2e} -> {learning_rate(step, cfg):.2e}"
    )
