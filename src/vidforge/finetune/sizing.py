"""What a fine-tune sizes from its data and its base, before the user's --set (which wins): the settings
`vidforge finetune` owns because it knows the buckets and the model, where a profile's fixed numbers would
refuse or starve the run.

- data.token_budget: the largest bucket's tokens (its frames and size through the base's VAE compression
  and the model's patch), so every clip the run tokenizes fits a packed micro-batch. 49 frames at 480x832
  through Wan2.1's 4x8x8 VAE and 1x2x2 patch: 13 x 30 x 52 = 20,280 tokens.
- train.warmup_steps: a tenth of the run, at most WARMUP_MAX (the LoRA trainers' short warm-up).
- train.log_every: LOG_POINTS points over the run at least (a 40-step run logs every 2 steps), never less
  often than the profile says.
- infer.frames/height/width: the largest trained bucket, so the validation videos show what was trained.
- infer.fps and curation.fps: the base's own frame rate (a TI2V folder's 24), else its family's
  (`FamilySpec.media_defaults`): clips are re-timed to it and validation videos play at it.
- train.activation_checkpointing: auto (the least recompute the memory model finds fits the accelerator,
  `vidforge.estimate.recompute`) where the profile leaves it at none: a user picks the data and the card,
  not the recompute. A profile that names full or selective (a `bench plan --fit` recipe) keeps it."""

from __future__ import annotations

from vidforge.data.token_budget import bucket_tokens
from vidforge.families import family
from vidforge.profile import RunProfile
from vidforge.profile.overrides import Override, Settings, as_overrides

WARMUP_MAX = 10
LOG_POINTS = 20


def training_clip(profile: RunProfile) -> tuple[int, int, int]:
    """The largest clip the run trains on (frames, height, width): what the memory check and validation size."""
    height, width = max(profile.data.buckets, key=lambda hw: hw[0] * hw[1])
    return max(profile.data.frame_buckets), height, width


def frame_rate(profile: RunProfile) -> int:
    """The base's frame rate when its settings name one (infer.fps off the schema's default), else the
    family's (`media_defaults`' infer.fps), else the profile's."""
    from vidforge.profile.infer import Infer

    if profile.infer.fps != Infer.model_fields["fps"].default:
        return profile.infer.fps
    media = family(profile.model.family).media_defaults(profile.model)
    return int(media.get("infer.fps", profile.infer.fps))


def given(overrides: Settings) -> set[str]:
    """The fields the user's --set names (`data.token_budget=...` -> `data.token_budget`)."""
    return {item.key for item in as_overrides(overrides)}


def sized_settings(profile: RunProfile, overrides: Settings) -> list[Override]:
    """The settings above for `profile` (resolved with the user's --set), less those `overrides` name."""
    frames, height, width = training_clip(profile)
    steps, fps = profile.train.steps, frame_rate(profile)
    sized = {
        "data.token_budget": max(bucket_tokens(profile).values()),
        "train.warmup_steps": min(WARMUP_MAX, steps // 10),
        "train.log_every": max(1, min(profile.train.log_every, steps // LOG_POINTS)),
        "infer.frames": frames,
        "infer.height": height,
        "infer.width": width,
        "infer.fps": fps,
        "curation.fps": fps,
    }
    if profile.train.activation_checkpointing == "none":
        sized["train.activation_checkpointing"] = "auto"
    if "infer.fps" in given(overrides):  # the user's frame rate is the clips' too, unless they say
        sized["curation.fps"] = profile.infer.fps
    user = given(overrides)
    return as_overrides({key: value for key, value in sized.items() if key not in user})
