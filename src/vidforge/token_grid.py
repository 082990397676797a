"""The token grid of a latent under a patch size: the one rule that both the torch-free planning code (token
budgets against the buckets, checked before a command builds anything) and the patchify below the model use."""

from __future__ import annotations

from collections.abc import Sequence

from vidforge.errors import UserInputError

Grid = tuple[int, int, int]


def token_grid(latent_thw: Sequence[int], patch: Sequence[int]) -> Grid:
    """The token grid (T/pt, H/ph, W/pw) of a latent of size (T, H, W). Raises ValueError if a size is not
    a multiple of its patch size."""
    if len(latent_thw) != 3 or len(patch) != 3:
        raise ValueError(f"latent size and patch must have 3 entries (t, h, w), got {latent_thw} and {patch}")
    for axis, size, p in zip("THW", latent_thw, patch, strict=True):
        if size < 1 or size % p:
            raise UserInputError(
                f"latent {axis}={size} is not a positive multiple of the patch size {p} (model.patch="
                f"{list(patch)}); crop or pad the latent, or change model.patch"
            )
    return (latent_thw[0] // patch[0], latent_thw[1] // patch[1], latent_thw[2] // patch[2])


def clip_tokens(
    frames: int, height: int, width: int, compression: Sequence[int], patch: Sequence[int]
) -> int:
    """Tokens of a clip of frames x height x width pixels: its latent under the VAE's (temporal, spatial)
    `compression` (1 + (frames - 1) / t frames: a causal VAE's first frame alone), then the model's patch."""
    ct, cs = compression
    t, h, w = token_grid(((frames - 1) // ct + 1, height // cs, width // cs), patch)
    return t * h * w
