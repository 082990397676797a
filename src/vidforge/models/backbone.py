"""What every model family's network shares: the forward interface (see `vidforge.families.vidforge.dit`) and its
skeleton, input layer -> blocks -> output layer over the conditioning. A family (the DiT and ST-DiT,
Wan2.1) supplies its conditioning from the placed tokens, its input and output layers and its blocks;
the trainer, the samplers and the parallel code see one signature."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from vidforge.errors import UserInputError
from vidforge.models.layers import Conditioning
from vidforge.models.token_inputs import (
    TokenPlacement,
    check_conditions,
    join_condition,
    model_tokens,
    place_tokens,
)
from vidforge.profile.model import Model
from vidforge.tokens import Grid, Segments, SequenceLayout, TokenShard, unpatchify


class VideoTransformer(nn.Module, ABC):
    """A diffusion transformer over latent video tokens. Subclasses build `config` and `blocks` (a
    ModuleDict keyed by the block index, so pipeline stages may delete entries and keep names) and
    define `conditioning`, `embed` and `head`, and name their `input_layers` and `output_layers`; a
    pipeline stage that dropped them (None) takes (returns) hidden states."""

    config: Model
    blocks: nn.ModuleDict
    input_layers: tuple[str, ...] = ()
    """Attributes (modules or parameters) only the first pipeline stage keeps: the input layer."""
    output_layers: tuple[str, ...] = ()
    """Attributes only the last pipeline stage keeps: the output layer. Everything else outside `blocks`
    (the conditioning) is on every stage."""
    token_levels: bool = False
    """The network takes a noise level per token ((rows, S), like the tokens) besides one per sample:
    first-frame image conditioning gives the condition frame's tokens level 0 (Wan2.2 TI2V)."""
    step_cache: Any = None
    """While sampling with infer.cache: `step_cache(model, h, cond, run_blocks)` stands in for the block
    stack and may skip it (`vidforge.sampling.step_cache`, which installs it). None: the blocks run."""

    @property
    def has_input_layer(self) -> bool:
        """False on a pipeline stage that dropped the input layer: it takes hidden states."""
        return all(getattr(self, name) is not None for name in self.input_layers)

    @property
    def has_output_layer(self) -> bool:
        """False on a pipeline stage that dropped the output layer: it returns hidden states."""
        return all(getattr(self, name) is not None for name in self.output_layers)

    @abstractmethod
    def conditioning(
        self,
        place: TokenPlacement,
        noise_level: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None,
        drop_text: torch.Tensor | None,
    ) -> Conditioning:
        """The family's conditioning of checked inputs whose tokens sit as `place` says."""

    def image_conditioning(self, place: TokenPlacement, image: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Image-embedding tokens (N, L_img, image_dim) -> (their projection, its cross-attention mask), laid
        out as the caption's; a family without an image input refuses."""
        raise UserInputError(
            f"model.family={self.config.family} with image_dim=0 takes no image embedding; drop the image"
        )

    @abstractmethod
    def embed(self, tokens: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Patch tokens (B, S, pt*ph*pw*C) -> hidden states (B, S, hidden)."""

    @abstractmethod
    def head(self, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Hidden states -> patch-token outputs (B, S, pt*ph*pw*C)."""

    def condition(
        self,
        noise_level: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None = None,
        drop_text: torch.Tensor | None = None,
        *,
        batch: int = 1,
        grid: Grid | None = None,
        layout: SequenceLayout | None = None,
        shard: TokenShard | None = None,
        image: torch.Tensor | None = None,
    ) -> Conditioning:
        """Everything the blocks need besides the tokens. Small and cheap, so pipeline stages recompute
        it. Give `grid` (plain batch of `batch` samples) or `layout` (packed row), or `shard` (this
        context-parallel rank's part of either; it carries the grid or layout). `noise_level` is (N,), or
        per token (rows, S) where the network has `token_levels`. `image`: (N, L_img, image_dim) image
        embeddings of an image-to-video family."""
        place = place_tokens(batch, grid, layout, shard, text.device)
        rows = batch if place.token_sample is None else 1  # a packed row is one row of every sample
        per_token = (rows, place.positions.shape[0]) if self.token_levels else None
        check_conditions(noise_level, text, text_mask, place.samples, self.config.text_dim, per_token)
        cond = self.conditioning(place, noise_level, text, text_mask, drop_text)
        if image is not None:
            if image.ndim != 3 or image.shape[0] != place.samples or image.shape[2] != self.config.image_dim:
                raise ValueError(
                    f"image must be (N, L, image_dim) = ({place.samples}, L, {self.config.image_dim}), got "
                    f"{tuple(image.shape)}"
                )
            tokens, mask = self.image_conditioning(place, image)
            cond = replace(cond, image=tokens, image_mask=mask)
        if self.config.attention in ("flash", "flex"):  # their device tensors made here, read in the blocks
            masks = [scope.mask for scope in cond.scopes.values()] + [cond.text_mask, cond.image_mask]
            for mask in masks:
                if isinstance(mask, Segments):
                    mask.prepare(text.device)
        return cond

    def run_blocks(self, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The block stack: hidden states in, hidden states out."""
        for block in self.blocks.values():
            h = block(h, cond)
        return h

    def forward(
        self,
        x: torch.Tensor,
        noise_level: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None = None,
        *,
        layout: SequenceLayout | None = None,
        grid: Grid | None = None,
        drop_text: torch.Tensor | None = None,
        shard: TokenShard | None = None,
        condition: torch.Tensor | None = None,
        image: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`condition`: the model.condition_channels latents read beside x and not predicted (image-to-video),
        laid out as x (latents, or tokens of the same layout); `image`: image embeddings (N, L, image_dim)."""
        cfg = self.config
        inputs = model_tokens(x, cfg.in_channels, cfg.patch, layout, grid, shard)
        cond = self.condition(
            noise_level,
            text,
            text_mask,
            drop_text,
            batch=x.shape[0],
            grid=inputs.grid,
            layout=layout,
            shard=shard,
            image=image,
        )
        if self.has_input_layer:
            tokens = join_condition(inputs, condition, cfg.in_channels, cfg.condition_channels, cfg.patch)
            h = self.embed(tokens, cond)
        else:
            h = inputs.tokens
        if self.step_cache is None:
            h = self.run_blocks(h, cond)
        else:
            h = self.step_cache(self, h, cond, self.run_blocks)
        if not self.has_output_layer:
            return h
        out = self.head(h, cond)
        if inputs.latents_in:
            return unpatchify(out, inputs.grid, cfg.patch, cfg.in_channels)
        return out
