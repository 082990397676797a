"""`stages`: a curriculum, run in order by `vidforge train` (vidforge.train.curriculum), each stage
starting from the previous one's EMA weights (of a two-expert model, its own expert's latest stage). A
stage overrides a few fields of the profile (its data, buckets, lengths, steps, learning rate, batch, the
expert it trains); everything else (model, layout, objective) is the profile's.
Each stage's resulting profile must pass the whole validation, layout rulebook included
(`checks.stage_problems`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vidforge.profile.data import Source
from vidforge.section import Section

# Stage field -> (section, field) of the profile it overrides.
OVERRIDES = {
    "data": ("data", "sources"),
    "buckets": ("data", "buckets"),
    "frame_buckets": ("data", "frame_buckets"),
    "token_budget": ("data", "token_budget"),
    "batch_size": ("data", "batch_size"),
    "steps": ("train", "steps"),
    "lr": ("train", "lr"),
    "warmup_steps": ("train", "warmup_steps"),
    "micro_batch": ("train", "micro_batch"),
    "grad_accum": ("train", "grad_accum"),
    "expert": ("train", "expert"),
}


class Stage(Section):
    """One stage of a curriculum; a field left out keeps the profile's value."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """A label for the stage's folder (RUN/stages/NN-name), its metrics lines and checkpoints."""
    steps: int = Field(ge=1)
    """Optimizer steps of this stage (train.steps); each stage counts from 0 with a new optimizer."""
    data: list[Source] | None = None
    """Latent shard directories of this stage, with weights (data.sources): tokenized at this stage's
    buckets. Left out: the profile's data.sources, else `--data`."""
    buckets: list[tuple[int, int]] | None = None
    """(height, width) resolution buckets (data.buckets), what this stage's data was tokenized at."""
    frame_buckets: list[int] | None = None
    """Frame counts (data.frame_buckets): [1] is an image stage, [1, 81] images and videos together."""
    lr: float | None = Field(None, gt=0)
    """Peak learning rate (train.lr)."""
    warmup_steps: int | None = Field(None, ge=0)
    """Warm-up steps (train.warmup_steps), below `steps`."""
    micro_batch: int | None = Field(None, ge=1)
    """Samples per rank per forward (train.micro_batch)."""
    grad_accum: int | None = Field(None, ge=1)
    """Micro-batches per optimizer step (train.grad_accum)."""
    token_budget: int | None = Field(None, ge=1)
    """Tokens per packed micro-batch (data.token_budget): grows with the resolution."""
    batch_size: int | None = Field(None, ge=1)
    """Samples per micro-batch in the bucketed mode (data.batch_size)."""
    expert: Literal["high", "low"] | None = None
    """Of a two-expert model (Wan2.2 A14B), the expert this stage trains (train.expert). A stage training
    another expert than the stage before starts from that expert's latest stage, else from its weights in
    --init, not from the other expert's (`vidforge.train.curriculum`)."""

    def overrides(self) -> dict[str, dict[str, Any]]:
        """The profile fields this stage sets, by section."""
        sections: dict[str, dict[str, Any]] = {}
        for name, (section, field) in OVERRIDES.items():
            value = getattr(self, name)
            if value is not None:
                sections.setdefault(section, {})[field] = value
        return sections
