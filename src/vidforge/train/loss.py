"""The training loss, owned in one place for every layout: plain batches, packed rows, context-parallel
shards and the last stage of a pipeline.

`DenoisingLoss.draw` turns a batch into the network's inputs and the target. Its random draws happen in
one order whatever the layout, so every rank of a model-parallel group (and one process given the same
data) draws the same values: per sample the noise level, then the caption dropout, then the noise in the
full batch's shape (latents (B, C, T, H, W) or the packed row's tokens), all from torch's global CPU
generator, whose state the checkpoint saves (a resumed run draws what an uninterrupted one would have),
and then moved to the device: a GPU run draws the CPU run's values (its initial weights are drawn on the
CPU too, `vidforge.models.cpu_draws`, so the generator stands where the CPU run's does).
The network always sees tokens: a plain batch is patchified ((B, S, F) with its `grid`), a packed row is
(1, S, F) with its `layout`, a context-parallel rank holds its `TokenShard` of either.

`DenoisingLoss.reduce` turns the network's output into the micro-batch's mean loss (a rank's share of it
under context parallel: the shares sum to one process's mean) and per-sample losses for the metrics. The
formulas belong to the objective (`vidforge.diffusion.Objective`): loss = mean (s (F - target))^2, s the
objective's `error_scale` (1 for most).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from vidforge.data.batching import CONDITION, BucketBatch, PackedBatch
from vidforge.diffusion.objective import Objective
from vidforge.errors import UserInputError
from vidforge.tokens import Grid, SequenceLayout, TokenShard, patchify, token_grid

ShardOf = Callable[[SequenceLayout | Grid], TokenShard]
"""This context-parallel rank's `TokenShard` of a packed row's layout or a plain batch's token grid."""


@dataclass
class MicroInputs:
    """One micro-batch as the network takes it, and what the loss needs."""

    x: torch.Tensor  # network input tokens: (B, S, F) plain, (1, S, F) packed, (rows, local, F) a shard
    target: torch.Tensor  # the raw output that makes the loss zero, same shape as x's output
    model_kwargs: dict[str, Any]  # noise_level, text, text_mask, drop_text and one of grid/layout/shard
    level: torch.Tensor  # (N,) each sample's noise level
    tokens: int  # model tokens processed (the whole row's, under context parallel too)
    layout: SequenceLayout | None = None
    shard: TokenShard | None = None
    error_scale: torch.Tensor | None = None  # the objective's, broadcast like the level; None: 1
    clean_first_frame: torch.Tensor | None = (
        None  # (rows, S) bool: clean first-frame tokens, outside the loss
    )


@dataclass
class MicroLoss:
    loss: torch.Tensor  # scalar: the micro-batch's mean loss (this rank's share under context parallel)
    level: torch.Tensor  # (N,) noise level of each sample
    per_sample: torch.Tensor  # (N,) mean loss of each sample (detached, whole samples)
    tokens: int  # model tokens processed
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenBatch:
    """A batch as the network sees it, before any noise: tokens (B, S, F) of a plain batch with its
    `grid`, or a packed row (1, S, F) with its `layout`."""

    clean: torch.Tensor
    text: torch.Tensor
    text_mask: torch.Tensor
    row: SequenceLayout | Grid
    tokens: int  # model tokens

    @property
    def layout(self) -> SequenceLayout | None:
        return self.row if isinstance(self.row, SequenceLayout) else None

    @property
    def where(self) -> dict[str, Any]:
        """The model's keyword for the geometry."""
        return {"layout": self.row} if self.layout is not None else {"grid": self.row}

    def per_sample(self, values: torch.Tensor) -> torch.Tensor:
        """Per-sample values (N,) broadcast against the tokens, in their precision (at least float32)."""
        out = self.layout.per_token(values)[..., None] if self.layout is not None else values[:, None, None]
        return out.to(torch.promote_types(self.clean.dtype, torch.float32))

    def sample_means(self, x: torch.Tensor) -> torch.Tensor:
        """Each sample's mean of x (shaped like the tokens): (N,)."""
        layout = self.layout
        if layout is None:
            return x.mean(dim=(1, 2))
        per_token = x.mean(dim=-1)[0]
        sums = per_token.new_zeros(layout.num_samples).index_add_(0, layout.sample_index(x.device), per_token)
        return sums / torch.tensor(layout.seqlens, device=x.device, dtype=sums.dtype)

    def sample_mean(self, x: torch.Tensor) -> torch.Tensor:
        """Each sample's mean of x, broadcast back against x (`vidforge.diffusion.dmd.SampleMean`)."""
        means = self.sample_means(x)
        return self.layout.per_token(means)[..., None] if self.layout is not None else means[:, None, None]


@dataclass(frozen=True)
class DenoisingLoss:
    """The objective's loss on vidforge's batches (see the module docstring)."""

    objective: Objective
    caption_dropout: float
    patch: tuple[int, int, int]
    in_channels: int
    text_dim: int | None = None
    """The model's text width (`model.text_dim`); None: unchecked."""
    image_condition: float = 0.0
    """`diffusion.image_condition`: the probability that a sample is conditioned on its first latent
    frame (`first_frame_tokens`); 0 draws nothing, so the draws above stay as they were."""
    condition_channels: int = 0
    """Image-to-video (`model.condition_channels`): the batch's condition latents go to the network beside
    the noisy latents, untouched by the noise, and its image embeddings with them; the loss stays on the
    video latents (the network predicts only those)."""

    def draw(
        self, batch: PackedBatch | BucketBatch, device: torch.device, shard_of: ShardOf | None = None
    ) -> MicroInputs:
        """Noise the batch: the network's input, the target and the conditioning. With `shard_of`
        (context parallel) only this rank's tokens, drawn from the same full-shape noise."""
        self._check_text_width(batch.text_emb.shape[-1])
        n = batch.text_emb.shape[0]
        level = self._objective_of(batch).sample_levels(n).to(device)
        drop_text = (torch.rand(n) < self.caption_dropout).to(device)
        conditioned = (torch.rand(n) < self.image_condition).to(device) if self.image_condition else None
        self._check_channels(_channels(batch, self.patch))
        clean = _clean_of(batch)
        noise = torch.randn(clean.shape, dtype=clean.dtype)  # in the batch's shape: latents or a row
        if isinstance(batch, BucketBatch):
            noise = patchify(noise, self.patch)
        rows = self.token_batch(batch, device)
        clean, noise = rows.clean, noise.to(device, non_blocking=True)
        text, text_mask, layout, tokens = rows.text, rows.text_mask, rows.layout, rows.tokens
        shard = shard_of(rows.row) if shard_of is not None else None
        if shard is not None:
            from vidforge.parallel.context_parallel import per_token

            clean, noise = shard.split(clean), shard.split(noise)
            level_b, where = per_token(level, shard), {"shard": shard}
        else:
            level_b, where = rows.per_sample(level), rows.where
        # the coefficients in the latents' precision, at least float32
        level_b = level_b.to(torch.promote_types(clean.dtype, torch.float32))
        clean_first_frame, network_level = None, self.objective.network_level(level)
        if conditioned is not None:
            clean_first_frame = first_frame_tokens(rows, conditioned)
            level_b = torch.where(clean_first_frame[..., None], torch.zeros_like(level_b), level_b)
            network_level = self.objective.network_level(level_b[..., 0])
        noisy = self.objective.corrupt(clean, noise, level_b)
        return MicroInputs(
            x=self.objective.network_input(noisy, level_b),
            target=self.objective.target(clean, noise, level_b),
            model_kwargs={
                "noise_level": network_level,
                "text": text,
                "text_mask": text_mask,
                "drop_text": drop_text,
                **where,
                **self.image_inputs(batch, device, shard),
            },
            level=level,
            tokens=tokens,
            layout=layout,
            shard=shard,
            error_scale=self.objective.error_scale(level_b),
            clean_first_frame=clean_first_frame,
        )

    def _objective_of(self, batch: PackedBatch | BucketBatch) -> Objective:
        """The objective at the batch's tokens per sample (a flow shift that follows the size: one shape
        per plain batch; a packed row's samples differ, and such an objective is refused there)."""
        if isinstance(batch, BucketBatch):
            return self.objective.at_tokens(math.prod(token_grid(batch.latents.shape[2:], self.patch)))
        if getattr(self.objective, "shift_tokens", None) is not None:
            raise UserInputError(
                "diffusion.flow_shift_tokens: a shift by each sample's token count takes plain batches; set "
                "data.packing=false"
            )
        return self.objective

    def image_inputs(
        self, batch: PackedBatch | BucketBatch, device: torch.device, shard: TokenShard | None = None
    ) -> dict[str, torch.Tensor]:
        """The network's image-to-video keywords for `batch` (none for a text-to-video model): its condition
        latents as tokens laid out as the clean ones (this rank's under context parallel) and its image
        embeddings when it has them."""
        if not self.condition_channels:
            return {}
        if batch.condition is None:
            raise UserInputError(
                f"model.condition_channels={self.condition_channels}: the data has no {CONDITION} (an "
                "image-to-video model trains on clips tokenized with its profile: `vidforge tokenize -p` the "
                "profile `model import` wrote)"
            )
        condition = batch.condition
        if isinstance(batch, BucketBatch):
            condition = patchify(condition, self.patch)
        condition = condition.to(device, non_blocking=True)
        if shard is not None:
            condition = shard.split(condition)
        out = {"condition": condition}
        if batch.image_emb is not None:
            out["image"] = batch.image_emb.to(device, non_blocking=True)
        return out

    def token_batch(self, batch: PackedBatch | BucketBatch, device: torch.device) -> TokenBatch:
        """The batch's clean tokens on `device` with its conditioning and geometry (no random draws)."""
        self._check_channels(_channels(batch, self.patch))
        # non_blocking: a prefetched batch sits in pinned memory, so the copy overlaps the GPU's work
        if isinstance(batch, PackedBatch):
            clean, row, rows = batch.tokens, batch.layout, 1
        else:
            clean = patchify(batch.latents, self.patch)
            row, rows = token_grid(batch.latents.shape[2:], self.patch), batch.latents.shape[0]
        layout = row if isinstance(row, SequenceLayout) else None
        return TokenBatch(
            clean=clean.to(device, non_blocking=True),
            text=batch.text_emb.to(device, non_blocking=True),
            text_mask=batch.text_mask.to(device, non_blocking=True),
            row=row,
            tokens=layout.total if layout is not None else rows * row[0] * row[1] * row[2],
        )

    def reduce(
        self, output: torch.Tensor, inputs: MicroInputs, cp_group: dist.ProcessGroup | None = None
    ) -> MicroLoss:
        """The micro-batch's loss from the network's raw output. Under context parallel (`inputs.shard`)
        `loss` is this rank's share (over the whole row's element count, pads excluded) and the
        per-sample losses are summed over `cp_group`."""
        dtype = torch.promote_types(output.dtype, torch.float32)  # the squared error in fp32 or wider
        error = output.to(dtype) - inputs.target.to(dtype)
        if inputs.error_scale is not None:
            error = error * inputs.error_scale.to(dtype)
        squared = error.square()
        if inputs.clean_first_frame is not None:  # no loss there: each sample's mean over the rest
            return self._reduce_conditioned(squared, inputs)
        per_token = squared.detach().mean(dim=-1)  # (rows, S)
        n = inputs.level.shape[0]
        shard = inputs.shard
        if shard is not None:
            from vidforge.parallel.context_parallel import shard_loss

            real = shard.valid(per_token.device)
            per_token = torch.where(real[None], per_token, 0.0)
            if shard.packed:
                sums = per_token.new_zeros(n).index_add_(
                    0, shard.token_sample(per_token.device), per_token[0]
                )
                counts = torch.tensor(shard.layout.seqlens, device=sums.device, dtype=sums.dtype)
            else:
                sums = per_token.sum(dim=1)
                counts = torch.full((n,), float(shard.total), device=sums.device, dtype=sums.dtype)
            dist.all_reduce(sums, group=cp_group)
            return MicroLoss(shard_loss(squared, shard), inputs.level.detach(), sums / counts, inputs.tokens)
        if inputs.layout is not None:
            layout = inputs.layout
            sums = per_token.new_zeros(n).index_add_(0, layout.sample_index(per_token.device), per_token[0])
            per_sample = sums / torch.tensor(layout.seqlens, device=sums.device, dtype=sums.dtype)
        else:
            per_sample = per_token.mean(dim=1)
        return MicroLoss(squared.mean(), inputs.level.detach(), per_sample, inputs.tokens)

    def _reduce_conditioned(self, squared: torch.Tensor, inputs: MicroInputs) -> MicroLoss:
        """`reduce` with the clean first-frame tokens left out: the loss is the mean over the denoised
        tokens' elements, each sample's over its own (a plain batch or a packed row)."""
        keep = ~inputs.clean_first_frame
        squared = torch.where(
            keep[..., None], squared, torch.zeros((), dtype=squared.dtype, device=squared.device)
        )
        per_token = squared.detach().sum(dim=-1)  # (rows, S)
        kept = keep.to(per_token.dtype)
        if inputs.layout is not None:
            index = inputs.layout.sample_index(per_token.device)
            n = inputs.level.shape[0]
            sums = per_token.new_zeros(n).index_add_(0, index, per_token[0])
            counts = per_token.new_zeros(n).index_add_(0, index, kept[0])
        else:
            sums, counts = per_token.sum(dim=1), kept.sum(dim=1)
        features = squared.shape[-1]
        loss = squared.sum() / (kept.sum().clamp(min=1) * features)
        return MicroLoss(loss, inputs.level.detach(), sums / (counts.clamp(min=1) * features), inputs.tokens)

    def _check_channels(self, channels: int) -> None:
        """A model built for other latents fails deep inside a matmul; say what to change instead."""
        if channels != self.in_channels:
            raise UserInputError(
                f"model.in_channels: the latents have {channels} channels (see the tokenizer in the data's "
                f"index.json), the model takes {self.in_channels}; set --set model.in_channels={channels}"
            )

    def _check_text_width(self, width: int) -> None:
        """The same for the caption embeddings, before any rank runs the network: under pipeline
        parallel a mismatch would fail inside the first stage's forward, reported by every rank's
        schedule (data whose index.json records its text encoder's width is refused at load already)."""
        if self.text_dim is not None and width != self.text_dim:
            raise UserInputError(
                f"model.text_dim: the data's text embeddings are {width} wide (see the text encoder in its "
                f"index.json), the model takes {self.text_dim}; set --set model.text_dim={width}"
            )


def first_frame_tokens(rows: TokenBatch, conditioned: torch.Tensor) -> torch.Tensor:
    """(rows, S) bool: the tokens of each conditioned sample's first latent frame (temporal position 0;
    the model's temporal patch is 1), given `conditioned` (N,) bool per sample."""
    layout = rows.layout
    if layout is not None:
        device = rows.clean.device
        first = layout.positions(device)[:, 0] == 0
        return (first & conditioned[layout.sample_index(device)])[None]
    t, h, w = rows.row
    first = torch.arange(t * h * w, device=rows.clean.device) < h * w  # tokens run t-major
    return conditioned[:, None] & first[None]


def _clean_of(batch: PackedBatch | BucketBatch) -> torch.Tensor:
    return batch.tokens if isinstance(batch, PackedBatch) else batch.latents


def _channels(batch: PackedBatch | BucketBatch, patch: tuple[int, int, int]) -> int:
    if isinstance(batch, PackedBatch):
        return batch.tokens.shape[-1] // (patch[0] * patch[1] * patch[2])
    return batch.latents.shape[1]
