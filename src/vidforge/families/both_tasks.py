"""What a published model that keeps text-to-video and image-to-video in one network trains with (Wan2.2
TI2V-5B, a folder saved as LTX-2's image-to-video pipeline): one owner for both families' default.
Torch-free: the specs read it."""

from __future__ import annotations

# Half of a fine-tune's clips conditioned on their own first latent frame, so that the one network keeps
# both of its tasks (diffusion.image_condition=1 fine-tunes image-to-video only, 0 text-to-video only).
BOTH_TASKS = {"diffusion.image_condition": 0.5}
