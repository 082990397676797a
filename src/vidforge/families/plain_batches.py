"""The families that train on plain batches only (hunyuan15, ltx2): their networks refuse packed rows and
dropped captions at the first forward (their unconditional branch reads the encoded empty prompt, which
training does not build yet). One owner for the settings that avoid both, and for the refusals: each
family's `layout_rules` at load, its network at the forward. Torch-free: the spec and the profile read it."""

from __future__ import annotations

from typing import Any

# Carried by every profile such a family gives (its presets' `profile_defaults` and a published folder's
# defaults), so the refusal at load never meets a profile the family made itself.
PLAIN_BATCHES = {"data.packing": False, "diffusion.caption_dropout": 0}


def packing_refusal(family: str) -> str:
    """The refusal of packed rows, for model.family=`family`."""
    return (
        f"data.packing: model.family={family} runs plain batches only so far (packed rows are not built); "
        "set data.packing=false"
    )


def caption_dropout_refusal(title: str) -> str:
    """The refusal of caption dropout, for the model called `title` (its published name)."""
    return (
        f"diffusion.caption_dropout: {title} trains its unconditional branch on its encoded empty prompt, "
        "not a dropped caption (not built yet); set diffusion.caption_dropout=0"
    )


def plain_batch_problems(profile: Any, family: str, title: str) -> list[str]:
    """What a profile asks that a plain-batch family refuses (for its `layout_rules`)."""
    problems = []
    if profile.data.packing:
        problems.append(packing_refusal(family))
    if profile.diffusion.caption_dropout > 0:
        problems.append(caption_dropout_refusal(title))
    return problems
