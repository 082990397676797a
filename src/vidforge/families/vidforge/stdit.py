"""ST-DiT blocks: attention factorised into spatial (within a frame) and temporal (across frames at
one position) parts.

- `STDiTBlock` (NeMo's ST-DiT, after Latte/Open-Sora): spatial attention, temporal attention,
  cross-attention and MLP in sequence, each with its own (shift, scale, gate).
- `ParallelSTDiTBlock` (after Vchitect-2.0's parallel block, video only): spatial, temporal and
  full-sequence attention read the same normalised input and their outputs are summed under one gate;
  then cross-attention and MLP. The three branches are independent, so they can overlap (or be split
  over devices). The paper's multimodal block, where every branch also attends to the caption, is
  `vidforge.families.vidforge.mmblock.MMParallelBlock` (model.stdit_block=parallel-mm).
"""

from __future__ import annotations

import torch
from torch import nn

from vidforge.families.vidforge.blocks import _attend, _norm
from vidforge.models.layers import MLP, Conditioning, CrossAttention, Modulation, SelfAttention, modulate
from vidforge.profile.model import Model


class STDiTBlock(nn.Module):
    chunks = 12  # spatial, temporal, cross, mlp

    def __init__(self, cfg: Model) -> None:
        super().__init__()
        self.modulation = Modulation(cfg.hidden, self.chunks, cfg.adaln_lora_rank)
        self.norm1, self.norm2 = _norm(cfg.hidden), _norm(cfg.hidden)
        self.norm3, self.norm4 = _norm(cfg.hidden), _norm(cfg.hidden)
        self.spatial_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.temporal_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.cross_attn = CrossAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.mlp = MLP(cfg.hidden, cfg.mlp_hidden, cfg.mlp_act)

    def forward(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        sh1, sc1, g1, sh2, sc2, g2, sh3, sc3, g3, sh4, sc4, g4 = self.modulation(cond)
        x = x + g1 * self.spatial_attn(modulate(self.norm1(x), sh1, sc1), cond.rope, cond.scopes["spatial"])
        x = x + g2 * self.temporal_attn(modulate(self.norm2(x), sh2, sc2), cond.rope, cond.scopes["temporal"])
        x = x + g3 * self.cross_attn(modulate(self.norm3(x), sh3, sc3), cond.text, cond.text_mask)
        return x + g4 * self.mlp(modulate(self.norm4(x), sh4, sc4))


class ParallelSTDiTBlock(nn.Module):
    """`attn_input` and `attn_sum` are parameter-free identities that name the branches' shared input and
    their sum, so parallel wrappers can act once on each rather than once per branch (tensor/sequence
    parallel gathers the input once and reduces the summed outputs once)."""

    chunks = 9  # summed attention branches, cross, mlp
    full_attention = "full_attn"  # the layer sliding-tile attention windows (`set_windows`)

    def __init__(self, cfg: Model) -> None:
        super().__init__()
        self.modulation = Modulation(cfg.hidden, self.chunks, cfg.adaln_lora_rank)
        self.norm1, self.norm2, self.norm3 = _norm(cfg.hidden), _norm(cfg.hidden), _norm(cfg.hidden)
        self.spatial_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.temporal_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.full_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.cross_attn = CrossAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.mlp = MLP(cfg.hidden, cfg.mlp_hidden, cfg.mlp_act)
        self.attn_input, self.attn_sum = nn.Identity(), nn.Identity()

    def forward(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        sh1, sc1, g1, sh2, sc2, g2, sh3, sc3, g3 = self.modulation(cond)
        h = self.attn_input(modulate(self.norm1(x), sh1, sc1))
        branches = self.attn_sum(
            self.spatial_attn(h, cond.rope, cond.scopes["spatial"])
            + self.temporal_attn(h, cond.rope, cond.scopes["temporal"])
            + self.full_attn(h, cond.rope, cond.scopes["full"])
        )
        x = x + g1 * branches
        x = x + g2 * self.cross_attn(modulate(self.norm2(x), sh2, sc2), cond.text, cond.text_mask)
        return x + g3 * self.mlp(modulate(self.norm3(x), sh3, sc3))
