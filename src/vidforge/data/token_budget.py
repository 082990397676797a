"""Tokens a sample takes at the profile's buckets, and the refusal of a token budget no bucket fits: torch-free,
so the command line (finetune's checks before any stage, train before it builds) asks without loading torch."""

from __future__ import annotations

from collections.abc import Sequence

from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.token_grid import clip_tokens, token_grid


def sample_tokens(latent_shape: Sequence[int], patch: Sequence[int]) -> int:
    """Tokens of a latent (C, T, H, W) after the model's patchify: (T/pt)(H/ph)(W/pw)."""
    t, h, w = token_grid(tuple(latent_shape)[-3:], patch)
    return t * h * w


def bucket_tokens(profile: RunProfile) -> dict[tuple[int, int, int], int]:
    """Tokens of a sample at each (frames, height, width) of the profile's frame and resolution buckets:
    the VAE's compression (tokenizer.temporal/spatial_compression), then the model's patch."""
    compression = (profile.tokenizer.temporal_compression, profile.tokenizer.spatial_compression)
    return {
        (f, h, w): clip_tokens(f, h, w, compression, profile.model.patch)
        for f in profile.data.frame_buckets
        for h, w in profile.data.buckets
    }


def require_token_budget(profile: RunProfile) -> None:
    """A packed run whose every bucket exceeds data.token_budget could never take a step (the packer would
    skip every sample): refused before anything is built."""
    if not profile.data.packing:
        return
    sizes = bucket_tokens(profile)
    (f, h, w), smallest = min(sizes.items(), key=lambda kv: kv[1])
    if smallest > profile.data.token_budget:
        raise UserInputError(
            f"data.token_budget={profile.data.token_budget}: no sample fits, the smallest bucket ({f} frames "
            f"at {h}x{w}) is {smallest} tokens; --set data.token_budget={smallest} (or more), or smaller "
            "data.buckets / data.frame_buckets"
        )
