"""The hunyuan15 family: HunyuanVideo-1.5 (text- and image-to-video). Its torch-free facts: the shape as
the profile holds it and the published presets (`config`), how a published folder reads (`published`),
LoRA's default targets; its code, loaded by import path: the network (`network`, diffusers'
`HunyuanVideo15Transformer3DModel` module for module) and weight import/export (`weights`)."""

from vidforge.families.hunyuan15.config import PRESETS

# The attention projections of both streams of every double-stream block (and, by the same names, of the
# caption refiner's blocks), as diffusers names them: the Wan family's choice with the caption stream's
# added. musubi-tuner adapts every Linear of the double-stream blocks (the feed-forwards and modulation
# too); train.lora.target_modules names those for a run that wants them.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")

__all__ = ["LORA_TARGETS", "PRESETS"]
