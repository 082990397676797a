"""The video diffusion transformer: patch embedding, conditioning, a stack of blocks, final layer.

One class serves both architectures; `model.architecture` picks the block (DiT, ST-DiT sequential or
parallel). The network F here is the raw EDM network: `vidforge.diffusion.EDM` wraps it with the
preconditioning (c_in on the input, c_skip/c_out on the output, c_noise as `noise_level`).

Inputs, either
- a plain batch: x (B, C, T, H, W) latents, returning (B, C, T, H, W); or
- a packed row: x (1, S, pt*ph*pw*C) patch tokens of several samples (`pack_latents`) with the
  `SequenceLayout` that describes them, returning tokens of the same shape;
plus, per sample (N = B, or the layout's sample count): noise_level (N,), text (N, L, text_dim),
text_mask (N, L) bool (True = real token), drop_text (N,) bool (True = use the learned null caption).

Context parallel: with `shard` (a `TokenShard` of the row's layout, or of a plain batch's grid), x is
this rank's tokens (B, shard.local, features) (`shard.split` of the full tokens) and the output is this
rank's tokens too. Positions, RoPE tables and the per-token sample index are sliced to the rank's
tokens; full self-attention receives a `ContextShard` mask that the context-parallel `Attend`
installed by `vidforge.parallel.context_parallel.apply_cp` evaluates (cross-attention stays local: each
rank's queries attend to their samples' whole captions).

Pipeline parallel may set `patch_embed` or `final` to None and delete entries of `blocks` (a ModuleDict
keyed by the block index, so parameter names stay stable); a stage without `patch_embed` takes hidden
states (B, S, hidden) and needs `grid` or `layout`, a stage without `final` returns hidden states. The
conditioning modules stay on every stage and recompute `condition(...)` there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vidforge.attention.sliding_tile import set_windows
from vidforge.families.vidforge.blocks import DiTBlock
from vidforge.families.vidforge.mmblock import MMParallelBlock
from vidforge.families.vidforge.stdit import ParallelSTDiTBlock, STDiTBlock
from vidforge.models.backbone import VideoTransformer
from vidforge.models.layers import Conditioning, FinalLayer, Modulation, TextProjection, TimestepEmbedding
from vidforge.models.rope import rope_tables, sincos_position_embedding
from vidforge.models.token_inputs import TokenPlacement
from vidforge.profile.model import Model
from vidforge.tokens import KeyPadding, Segments


def _mean_token(text: torch.Tensor, text_mask: torch.Tensor | None) -> torch.Tensor:
    """(N, L, D) caption tokens -> (N, D): the mean over each caption's real tokens."""
    if text_mask is None:
        return text.mean(dim=1)
    weight = text_mask.to(text.dtype)[..., None]
    return (text * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1)


def block_class(cfg: Model) -> type[nn.Module]:
    if cfg.architecture == "dit":
        return DiTBlock
    return {"parallel": ParallelSTDiTBlock, "parallel-mm": MMParallelBlock}.get(cfg.stdit_block, STDiTBlock)


class DiT(VideoTransformer):
    """DiT / ST-DiT over video latents, built from the profile's `model` section."""

    input_layers = ("patch_embed",)
    output_layers = ("final",)

    def __init__(self, config: Model) -> None:
        super().__init__()
        self.config = config
        block = block_class(config)
        hidden = config.hidden
        self.patch_embed = nn.Linear(config.patch_dim, hidden)
        self.time_embed = TimestepEmbedding(hidden)
        self.text_embed = TextProjection(config.text_dim, hidden)
        # model.text_pool: the caption's mean token into the timestep embedding (SD3's pooled text)
        self.text_pool = (
            nn.Sequential(nn.Linear(config.text_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
            if config.text_pool
            else None
        )
        # The caption used for the unconditional branch of classifier-free guidance: one learned token.
        self.null_text = nn.Parameter(torch.zeros(1, config.text_dim))
        # AdaLN-LoRA: the full-rank part of every block's modulation, shared by all blocks.
        self.shared_modulation = nn.Linear(hidden, block.chunks * hidden) if config.adaln_lora_rank else None
        self.blocks = nn.ModuleDict({str(i): block(config) for i in range(config.layers)})
        set_windows(self.blocks, config)
        self.final = FinalLayer(hidden, config.patch_dim)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """DiT's initialisation: Xavier-uniform matrices, zero biases, N(0, 0.02) for the timestep MLP,
        then zero for every modulation output and the final layer (adaLN-Zero). Callable again after
        building on the meta device and materialising with `to_empty`."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
        for layer in (self.time_embed.fc1, self.time_embed.fc2):
            nn.init.normal_(layer.weight, std=0.02)
        nn.init.normal_(self.null_text, std=0.02)
        for module in self.modules():
            if isinstance(module, Modulation | FinalLayer):
                module.zero_init()
            elif isinstance(module, MMParallelBlock):
                module.reset_context_latents()
        if self.shared_modulation is not None:
            nn.init.zeros_(self.shared_modulation.weight)
            nn.init.zeros_(self.shared_modulation.bias)

    # --- conditioning ---------------------------------------------------------------------------------

    def with_null_text(
        self, text: torch.Tensor, text_mask: torch.Tensor | None, drop_text: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Replace the captions of samples where drop_text is True by the learned null caption (one token,
        the rest masked). Done with `where`, so no host synchronisation."""
        if drop_text is None:
            return text, text_mask
        n, length, _ = text.shape
        drop = drop_text.to(torch.bool, copy=False)
        if drop.shape != (n,):
            raise ValueError(f"drop_text must be (N,) = ({n},) bool, got {tuple(drop_text.shape)}")
        if text_mask is None:
            text_mask = torch.ones(n, length, dtype=torch.bool, device=text.device)
        null = F.pad(self.null_text.to(text.dtype).expand(n, 1, -1), (0, 0, 0, length - 1))
        null_mask = torch.zeros(length, dtype=torch.bool, device=text.device)
        null_mask[0] = True
        text = torch.where(drop[:, None, None], null, text)
        text_mask = torch.where(drop[:, None], null_mask[None], text_mask)
        return text, text_mask

    def conditioning(
        self,
        place: TokenPlacement,
        noise_level: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None,
        drop_text: torch.Tensor | None,
    ) -> Conditioning:
        """The learned null caption where drop_text is True, the caption's real tokens, RoPE tables in
        the model's precision."""
        time = self.time_embed(noise_level)
        text, text_mask = self.with_null_text(text, text_mask, drop_text)
        if self.text_pool is not None:
            time = time + self.text_pool(_mean_token(text, text_mask))
        shared = self.shared_modulation(F.silu(time)) if self.shared_modulation is not None else None
        if place.query_lens is not None:
            # Packed: keep only real caption tokens, one key segment per sample (every rank holds a
            # chunk, >= 1 token and maybe only padding, of every sample under context parallel).
            if text_mask is None:  # every caption token is real: the lengths need no device sync
                text_lens = [text.shape[1]] * text.shape[0]
                text_tokens = self.text_embed(text.flatten(0, 1)).unsqueeze(0)
            else:
                text_lens = text_mask.sum(dim=1).tolist()
                text_tokens = self.text_embed(text[text_mask]).unsqueeze(0)
            cross_mask = Segments(place.query_lens, text_lens)
        else:
            text_tokens = self.text_embed(text)
            cross_mask = KeyPadding(text_mask) if text_mask is not None else None
        positions = place.positions
        table_dtype = torch.float64 if self.param_dtype == torch.float64 else torch.float32
        rope = rope_tables(positions, self.config.head_dim, self.config.rope_theta, table_dtype)
        return Conditioning(
            time, shared, text_tokens, cross_mask, rope, place.scopes, place.token_sample, positions
        )

    @property
    def param_dtype(self) -> torch.dtype:
        return self.time_embed.fc1.weight.dtype

    # --- layers around the blocks (the forward is `VideoTransformer.forward`) --------------------------

    def embed(self, tokens: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        h = self.patch_embed(tokens)
        if self.config.abs_position == "sincos":
            h = h + sincos_position_embedding(cond.positions, self.config.hidden, h.dtype)
        return h

    def head(self, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.final(h, cond)
