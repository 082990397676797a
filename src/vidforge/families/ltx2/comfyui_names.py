"""The ltx2 network's linear layers by the names ComfyUI's LTX-2 model gives them (`comfy/ldm/lightricks/
av_model.py`'s `LTXAVModel` over `model.py`'s `LTXVModel`: the names of Lightricks' LTX-2 release, which
its trainer's LoRAs carry too): the keys of a LoRA file ComfyUI loads (`vidforge.lora.comfyui`).
vidforge's names are diffusers'; the release's differ only outside the blocks (`proj_in` is its
`patchify_proj`, `time_embed` its `adaln_single`), the blocks' attentions and feed-forwards are named alike."""

from __future__ import annotations

import re

# Inside each block (`transformer_blocks.N.`): both attentions' projections (LTX-2.3's head gates too) and
# the feed-forward, under the same names.
BLOCK = frozenset(
    f"{attn}.{proj}"
    for attn in ("attn1", "attn2")
    for proj in ("to_q", "to_k", "to_v", "to_out.0", "to_gate_logits")
) | {"ff.net.0.proj", "ff.net.2"}

# Outside the blocks.
TOP: dict[str, str] = {
    "proj_in": "patchify_proj",
    "time_embed.emb.timestep_embedder.linear_1": "adaln_single.emb.timestep_embedder.linear_1",
    "time_embed.emb.timestep_embedder.linear_2": "adaln_single.emb.timestep_embedder.linear_2",
    "time_embed.linear": "adaln_single.linear",
    # LTX-2.3's per-step modulation of the caption cross-attention
    "prompt_adaln.emb.timestep_embedder.linear_1": "prompt_adaln_single.emb.timestep_embedder.linear_1",
    "prompt_adaln.emb.timestep_embedder.linear_2": "prompt_adaln_single.emb.timestep_embedder.linear_2",
    "prompt_adaln.linear": "prompt_adaln_single.linear",
    "caption_projection.linear_1": "caption_projection.linear_1",
    "caption_projection.linear_2": "caption_projection.linear_2",
    "proj_out": "proj_out",
}

_BLOCK = re.compile(r"transformer_blocks\.(\d+)\.(.+)")


def comfyui_module(name: str) -> str | None:
    """ComfyUI's name of the ltx2 network's layer `name` (`proj_in` -> `patchify_proj`); None for a layer
    that is not in the tables (not a linear layer of the network)."""
    block = _BLOCK.fullmatch(name)
    if block is None:
        return TOP.get(name)
    return name if block.group(2) in BLOCK else None
