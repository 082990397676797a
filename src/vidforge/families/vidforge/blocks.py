"""The DiT block: self-attention over all tokens of a sample, cross-attention to the caption, MLP;
each sub-layer pre-normalised with adaptive LayerNorm and gated (adaLN-Zero, Peebles & Xie 2023)."""

from __future__ import annotations

import torch
from torch import nn

from vidforge.attention.dispatch import Attend
from vidforge.models.layers import MLP, Conditioning, CrossAttention, Modulation, SelfAttention, modulate
from vidforge.profile.model import Model


def _norm(hidden: int) -> nn.LayerNorm:
    return nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)


def _attend(cfg: Model) -> Attend:
    return Attend(cfg.attention, cfg.sdpa_backend)


class DiTBlock(nn.Module):
    """x += g1 * SelfAttn(mod(norm x)); x += g2 * CrossAttn(mod(norm x), text); x += g3 * MLP(mod(norm x))."""

    chunks = 9  # (shift, scale, gate) for each of the three sub-layers
    full_attention = "self_attn"  # the layer sliding-tile attention windows (`set_windows`)

    def __init__(self, cfg: Model) -> None:
        super().__init__()
        self.modulation = Modulation(cfg.hidden, self.chunks, cfg.adaln_lora_rank)
        self.norm1, self.norm2, self.norm3 = _norm(cfg.hidden), _norm(cfg.hidden), _norm(cfg.hidden)
        self.self_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.cross_attn = CrossAttention(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.mlp = MLP(cfg.hidden, cfg.mlp_hidden, cfg.mlp_act)

    def forward(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        sh1, sc1, g1, sh2, sc2, g2, sh3, sc3, g3 = self.modulation(cond)
        x = x + g1 * self.self_attn(modulate(self.norm1(x), sh1, sc1), cond.rope, cond.scopes["full"])
        x = x + g2 * self.cross_attn(modulate(self.norm2(x), sh2, sc2), cond.text, cond.text_mask)
        return x + g3 * self.mlp(modulate(self.norm3(x), sh3, sc3))
