"""What the unconditional guidance branch reads, one rule for `vidforge infer` and training's validation:
the profile's `infer.negative_prompt`, or when that is empty the family's (`FamilySpec.negative_prompt`:
Wan's pipelines encode the empty caption), or else the model's learned null caption."""

from __future__ import annotations

import torch

from vidforge.families import family
from vidforge.profile import RunProfile


def negative_prompt(profile: RunProfile) -> str | None:
    """The caption the unconditional branch encodes; None for the model's null caption (`drop_text`)."""
    return profile.infer.negative_prompt or family(profile.model.family).negative_prompt


def negative_caption(profile: RunProfile, encoder) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`negative_prompt` encoded by `encoder` as (embeddings (1, L, D) float32, mask (1, L)), the
    `negative` of `vidforge.sampling.latents.sample_latents`; None for the null caption."""
    prompt = negative_prompt(profile)
    if prompt is None:
        return None
    return encoder.encode_to_sample([prompt])
