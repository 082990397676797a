"""What every model family's forward does before its own layers: check the inputs of the shared
interface (a plain batch of latents, a packed row of tokens with its `SequenceLayout`, or a context-
parallel rank's tokens with its `TokenShard`) and place the tokens (their (t, h, w) positions, attention
scopes and sample index). One copy, so the DiT and Wan read the same batches the same way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vidforge.errors import UserInputError
from vidforge.models.scopes import Scope, batch_scopes, packed_scopes, sharded_scopes
from vidforge.tokens import Grid, SequenceLayout, TokenShard, grid_positions, patchify, token_grid


@dataclass(frozen=True)
class ModelTokens:
    """The forward's input as patch tokens. `latents_in`: x was (B, C, T, H, W), so the output is
    unpatchified back to latents over `grid`."""

    tokens: torch.Tensor
    grid: Grid | None
    latents_in: bool


def model_tokens(
    x: torch.Tensor,
    in_channels: int,
    patch: tuple[int, int, int],
    layout: SequenceLayout | None,
    grid: Grid | None,
    shard: TokenShard | None,
) -> ModelTokens:
    """Check x against the interface and return its patch tokens (see `vidforge.families.vidforge.dit`)."""
    if shard is not None:
        if layout is not None or grid is not None:
            raise ValueError("forward(shard=...): the TokenShard carries the layout or grid; pass it alone")
        rows = 1 if shard.packed else x.shape[0]
        if x.ndim != 3 or x.shape[0] != rows or x.shape[1] != shard.local:
            raise ValueError(
                f"under context parallel x is this rank's tokens ({rows}, {shard.local}, features) "
                f"(TokenShard.split of the full row), got {tuple(x.shape)}"
            )
        return ModelTokens(x, None, False)
    if x.ndim == 5:
        if layout is not None:
            raise ValueError("a packed layout goes with packed tokens (1, S, features); see pack_latents")
        if x.shape[1] != in_channels:
            raise UserInputError(f"latents have {x.shape[1]} channels but model.in_channels={in_channels}")
        return ModelTokens(patchify(x, patch), token_grid(x.shape[2:], patch), True)
    if x.ndim == 3:
        if layout is not None:
            if x.shape[0] != 1 or x.shape[1] != layout.total:
                raise ValueError(
                    f"packed tokens must be (1, {layout.total}, features) for this layout, got {tuple(x.shape)}"
                )
        elif grid is None or x.shape[1] != grid[0] * grid[1] * grid[2]:
            raise ValueError(f"tokens {tuple(x.shape)} need a packed `layout` or the token `grid` they cover")
        return ModelTokens(x, grid, False)
    raise ValueError(f"x must be latents (B, C, T, H, W) or tokens (B, S, features), got {tuple(x.shape)}")


def join_condition(
    inputs: ModelTokens,
    condition: torch.Tensor | None,
    channels: int,
    condition_channels: int,
    patch: tuple[int, int, int],
) -> torch.Tensor:
    """The input layer's tokens: x's patch tokens, with each token's `condition_channels` condition
    latents (image-to-video's mask and first-frame latent) after its own channels, as patchifying the
    channel-wise concatenation [x, condition] would give. `condition` is laid out as x was (latents, or
    tokens of the same layout)."""
    if condition_channels == 0:
        if condition is not None:
            raise UserInputError("model.condition_channels=0: this model takes no condition latents")
        return inputs.tokens
    if condition is None:
        raise UserInputError(
            f"model.condition_channels={condition_channels}: this image-to-video model needs condition latents "
            "beside the noisy ones; tokenize its clips with its profile, or sample with --image"
        )
    if inputs.latents_in:
        if condition.ndim != 5 or condition.shape[1] != condition_channels:
            raise ValueError(
                f"condition must be latents (B, {condition_channels}, T, H, W) like x, got {tuple(condition.shape)}"
            )
        condition = patchify(condition, patch)
    per_token = patch[0] * patch[1] * patch[2]
    if condition.shape[:2] != inputs.tokens.shape[:2] or condition.shape[2] != per_token * condition_channels:
        raise ValueError(
            f"condition tokens must be {tuple(inputs.tokens.shape[:2])} x {per_token * condition_channels} "
            f"features like x's tokens, got {tuple(condition.shape)}"
        )
    joined = torch.cat(
        [
            inputs.tokens.unflatten(-1, (per_token, channels)),
            condition.to(inputs.tokens.dtype).unflatten(-1, (per_token, condition_channels)),
        ],
        dim=-1,
    )
    return joined.flatten(-2)


def check_conditions(
    noise_level: torch.Tensor,
    text: torch.Tensor,
    text_mask: torch.Tensor | None,
    samples: int,
    text_dim: int,
    token_levels: tuple[int, int] | None = None,
) -> None:
    """One noise level and one caption (N, L, text_dim) per sample, the mask (N, L) bool. With
    `token_levels` (rows, S) (a network that takes them) the noise level may instead be one per token,
    shaped like the tokens' first two dimensions."""
    if token_levels is not None and noise_level.ndim == 2:
        if tuple(noise_level.shape) != token_levels:
            raise ValueError(
                f"a per-token noise_level must be (rows, S) = {token_levels}, like the tokens, got "
                f"{tuple(noise_level.shape)}"
            )
    elif noise_level.shape != (samples,):
        raise ValueError(
            f"noise_level must be (N,) = ({samples},), one per sample, got {tuple(noise_level.shape)}"
        )
    if text.ndim != 3 or text.shape[0] != samples or text.shape[2] != text_dim:
        raise UserInputError(
            f"text must be (N, L, text_dim) = ({samples}, L, {text_dim}), got {tuple(text.shape)}; "
            "check model.text_dim against the text encoder"
        )
    if text_mask is not None and (text_mask.shape != text.shape[:2] or text_mask.dtype != torch.bool):
        raise ValueError(
            f"text_mask must be (N, L) = {tuple(text.shape[:2])} bool, got {text_mask.dtype} {tuple(text_mask.shape)}"
        )


@dataclass(frozen=True)
class TokenPlacement:
    """Where this forward's tokens sit. `query_lens`: tokens of each sample in the row (a rank's chunk
    of each under context parallel), the query side of packed cross-attention; None for a plain batch."""

    samples: int
    positions: torch.Tensor
    scopes: dict[str, Scope]
    token_sample: torch.Tensor | None
    query_lens: tuple[int, ...] | None


def place_tokens(
    batch: int,
    grid: Grid | None,
    layout: SequenceLayout | None,
    shard: TokenShard | None,
    device: torch.device,
) -> TokenPlacement:
    """Positions, scopes and per-token sample index of a plain batch (`grid`), a packed row (`layout`)
    or a context-parallel rank's share of either (`shard`, given alone: it carries the grid or layout)."""
    if shard is not None:
        if layout is not None or grid is not None:
            raise ValueError("condition(): a TokenShard carries the layout or grid; pass it alone")
        packed = shard.packed
        return TokenPlacement(
            shard.layout.num_samples if packed else batch,
            shard.positions(device),
            sharded_scopes(shard),
            shard.token_sample(device) if packed else None,
            shard.chunk_lens if packed else None,
        )
    if layout is not None:
        return TokenPlacement(
            layout.num_samples,
            layout.positions(device),
            packed_scopes(layout, device),
            layout.sample_index(device),
            layout.seqlens,
        )
    if grid is None:
        raise ValueError("condition() needs the token grid of a plain batch, or a packed layout")
    return TokenPlacement(batch, grid_positions(grid, device), batch_scopes(batch, grid), None, None)
