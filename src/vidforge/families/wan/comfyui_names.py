"""The wan network's linear layers by the names ComfyUI's Wan model gives them (`comfy/ldm/wan/model.py`'s
`WanModel`, the original Wan2.1/2.2 release's names, for T2V, I2V and TI2V alike): the keys of a LoRA file
ComfyUI loads (`vidforge.lora.comfyui`). vidforge's names are diffusers' (`attn1.to_q`), ComfyUI's
the release's (`self_attn.q`)."""

from __future__ import annotations

import re

# Inside each block (`blocks.N.`).
BLOCK: dict[str, str] = {
    "attn1.to_q": "self_attn.q",
    "attn1.to_k": "self_attn.k",
    "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o",
    "attn2.to_q": "cross_attn.q",
    "attn2.to_k": "cross_attn.k",
    "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o",
    "attn2.add_k_proj": "cross_attn.k_img",  # I2V: the image embedding's key and value
    "attn2.add_v_proj": "cross_attn.v_img",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
}

# Outside the blocks.
TOP: dict[str, str] = {
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
    "proj_out": "head.head",
}

_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def comfyui_module(name: str) -> str | None:
    """ComfyUI's name of the wan network's layer `name` (`blocks.0.attn1.to_q` -> `blocks.0.self_attn.q`);
    None for a layer that is not in the tables (not a linear layer of the network)."""
    block = _BLOCK.fullmatch(name)
    if block is None:
        return TOP.get(name)
    inner = BLOCK.get(block.group(2))
    return None if inner is None else f"blocks.{block.group(1)}.{inner}"
