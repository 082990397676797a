"""The hunyuan15 network's linear layers as ComfyUI's HunyuanVideo-1.5 model holds them (`comfy/ldm/
hunyuan_video/model.py`'s `HunyuanVideo` with the 1.5 release's modules, its double-stream blocks `comfy/ldm/
flux/layers.py`'s `DoubleStreamBlock`): the keys of a LoRA file ComfyUI loads (`vidforge.lora.comfyui`).
vidforge's names are diffusers' (`attn.to_q`); ComfyUI's are the release's as its loader renames them
(`img_mod.lin`, `img_mlp.0`, `time_in.in_layer`), with each attention's q, k and v in one `qkv` projection
(the release's double blocks keep them apart, ComfyUI's block fuses them): those are `Slot` parts. The
output norm's projection gives (shift, scale) in the release and ComfyUI, (scale, shift) in diffusers."""

from __future__ import annotations

import re

from vidforge.lora.comfyui import Slot

QKV = 3  # q, k, v: the parts of a fused projection

# Inside each double-stream block (`transformer_blocks.N.` -> `double_blocks.N.`).
BLOCK: dict[str, str | Slot] = {
    "attn.to_q": Slot("img_attn.qkv", 0, QKV),
    "attn.to_k": Slot("img_attn.qkv", 1, QKV),
    "attn.to_v": Slot("img_attn.qkv", 2, QKV),
    "attn.to_out.0": "img_attn.proj",
    "attn.add_q_proj": Slot("txt_attn.qkv", 0, QKV),
    "attn.add_k_proj": Slot("txt_attn.qkv", 1, QKV),
    "attn.add_v_proj": Slot("txt_attn.qkv", 2, QKV),
    "attn.to_add_out": "txt_attn.proj",
    "norm1.linear": "img_mod.lin",
    "norm1_context.linear": "txt_mod.lin",
    "ff.net.0.proj": "img_mlp.0",
    "ff.net.2": "img_mlp.2",
    "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
}

# Inside each block of the caption's token refiner (`context_embedder.token_refiner.refiner_blocks.N.` ->
# `txt_in.individual_token_refiner.blocks.N.`).
REFINER: dict[str, str | Slot] = {
    "attn.to_q": Slot("self_attn.qkv", 0, QKV),
    "attn.to_k": Slot("self_attn.qkv", 1, QKV),
    "attn.to_v": Slot("self_attn.qkv", 2, QKV),
    "attn.to_out.0": "self_attn.proj",
    "ff.net.0.proj": "mlp.0",
    "ff.net.2": "mlp.2",
    "norm_out.linear": "adaLN_modulation.1",
}

# Outside the blocks.
TOP: dict[str, str | Slot] = {
    "time_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "context_embedder.time_text_embed.timestep_embedder.linear_1": "txt_in.t_embedder.in_layer",
    "context_embedder.time_text_embed.timestep_embedder.linear_2": "txt_in.t_embedder.out_layer",
    "context_embedder.time_text_embed.text_embedder.linear_1": "txt_in.c_embedder.in_layer",
    "context_embedder.time_text_embed.text_embedder.linear_2": "txt_in.c_embedder.out_layer",
    "context_embedder.proj_in": "txt_in.input_embedder",
    "context_embedder_2.linear_1": "byt5_in.fc1",
    "context_embedder_2.linear_2": "byt5_in.fc2",
    "context_embedder_2.linear_3": "byt5_in.fc3",
    "image_embedder.linear_1": "vision_in.proj.1",
    "image_embedder.linear_2": "vision_in.proj.3",
    "norm_out.linear": Slot("final_layer.adaLN_modulation.1", swap_halves=True),
    "proj_out": "final_layer.linear",
}

_BLOCK = re.compile(r"transformer_blocks\.(\d+)\.(.+)")
_REFINER = re.compile(r"context_embedder\.token_refiner\.refiner_blocks\.(\d+)\.(.+)")


def _renamed(slot: str | Slot | None, prefix: str) -> str | Slot | None:
    if slot is None:
        return None
    if isinstance(slot, str):
        return prefix + slot
    return Slot(prefix + slot.name, slot.part, slot.parts, slot.swap_halves)


def comfyui_module(name: str) -> str | Slot | None:
    """ComfyUI's name (or `Slot`) of the hunyuan15 network's layer `name` (`transformer_blocks.0.attn.to_q`
    -> part 0 of 3 of `double_blocks.0.img_attn.qkv`); None for a layer not in the tables (not a linear
    layer of the network)."""
    block = _BLOCK.fullmatch(name)
    if block is not None:
        return _renamed(BLOCK.get(block.group(2)), f"double_blocks.{block.group(1)}.")
    refiner = _REFINER.fullmatch(name)
    if refiner is not None:
        return _renamed(
            REFINER.get(refiner.group(2)), f"txt_in.individual_token_refiner.blocks.{refiner.group(1)}."
        )
    return TOP.get(name)
