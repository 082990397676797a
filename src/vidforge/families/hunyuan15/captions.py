"""HunyuanVideo-1.5's two caption encoders in vidforge's one caption tensor (`config`'s module docstring
says the layout): what `encode_prompt` of diffusers' pipelines returns, joined for the network."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def join_caption(
    mllm: torch.Tensor, mllm_mask: torch.Tensor, glyph: torch.Tensor, glyph_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L, text_dim) MLLM states and (N, G, text_2_dim) glyph states with their masks -> the caption
    (N, L + G, text_dim), the glyph states zero-padded to the MLLM's width, and its (N, L + G) bool mask."""
    if glyph.shape[-1] > mllm.shape[-1]:
        raise ValueError(
            f"glyph states ({glyph.shape[-1]} wide) must fit the MLLM's {mllm.shape[-1]} features"
        )
    padded = F.pad(glyph, (0, mllm.shape[-1] - glyph.shape[-1])).to(mllm.dtype)
    return torch.cat([mllm, padded], dim=1), torch.cat([mllm_mask.bool(), glyph_mask.bool()], dim=1)
