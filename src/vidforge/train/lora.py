"""LoRA's adapters live in `vidforge.models.lora`; this name stays while `vidforge.infer.run` imports them
from here (issue 35: infer/run.py is being split; its imports then name vidforge.models.lora and this
module goes)."""

from vidforge.models.lora import is_adapter_folder, load_adapter

__all__ = ["is_adapter_folder", "load_adapter"]
