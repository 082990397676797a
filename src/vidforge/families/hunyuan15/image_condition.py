"""HunyuanVideo-1.5's image-to-video conditioning as diffusers' `HunyuanVideo15ImageToVideoPipeline` builds
it: the condition latents (`prepare_cond_latents_and_mask`: the first frame alone through the VAE, posterior
mode times the scaling factor, in latent frame 0 and zeros after, then a one-channel mask that is one on
latent frame 0; the model reads these `model.condition_channels` = latents + 1 channels after the noisy
latents') and the image embedding (`encode_image`: SigLIP's last hidden states of the image as its
`SiglipImageProcessor` prepares it). `tokenize`, training and `infer --image` reach both through the
family's spec (`condition_latents`, `image_encoder`)."""

from __future__ import annotations

from typing import Any

import torch

from vidforge.tokenizers.image_condition import ImageEncoder
from vidforge.tokenizers.interface import VideoTokenizer


def condition_latents(tokenizer: VideoTokenizer, first_frame: torch.Tensor, frames: int) -> torch.Tensor:
    """first_frame (B, 3, H, W) in [-1, 1] -> (B, C + 1, T, H/cs, W/cs): the first frame's latents (a
    one-frame video through the VAE) in latent frame 0 of the `frames`-frame video's T, zeros after, then
    the mask (one on latent frame 0)."""
    if first_frame.ndim != 4 or first_frame.shape[1] != 3:
        raise ValueError(f"first_frame must be (B, 3, H, W), got {tuple(first_frame.shape)}")
    latent = tokenizer.encode(first_frame[:, :, None]).float()  # (B, C, 1, h, w)
    b, c, _, h, w = latent.shape
    latent_frames = (frames - 1) // tokenizer.temporal_compression + 1
    condition = latent.new_zeros(b, c + 1, latent_frames, h, w)
    condition[:, :c, :1] = latent
    condition[:, c, 0] = 1.0
    return condition


class SiglipImageEncoder(ImageEncoder):
    """SigLIP's vision tower (`path`: the pipeline's image_encoder/) and its image processor (in
    feature_extractor/ beside it, the pipeline's layout), read as the pipeline's `encode_image` reads it:
    the last hidden states of the image resized and converted to RGB by the processor."""

    TOWER = "SigLIP"
    PROCESSOR_FOLDER = "feature_extractor"
    PIPELINE = "a HunyuanVideo-1.5 I2V pipeline's image_encoder/"

    def _classes(self) -> tuple[Any, Any]:
        from transformers import SiglipImageProcessor, SiglipVisionModel

        return SiglipImageProcessor, SiglipVisionModel

    def _pixels(self, images: list[Any]) -> Any:
        return self.processor.preprocess(
            images=images, do_resize=True, return_tensors="pt", do_convert_rgb=True
        )

    def _states(self, inputs: Any) -> torch.Tensor:
        return self.model(**inputs).last_hidden_state
