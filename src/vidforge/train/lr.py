"""Learning-rate schedule: linear warm-up, then cosine decay to a floor or constant."""

from __future__ import annotations

import math

from vidforge.profile.train import Train


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
