"""HunyuanVideo-1.5's image-to-video conditioning as diffusers' `HunyuanVideo15ImageToVideoPipeline` builds
it: the condition latents (`prepare_cond_latents_and_mask`: the first frame alone through the VAE, posterior
mode times the scaling factor, in latent frame 0 and zeros after, then a one-channel mask that is one on
latent frame 0; the model reads these `model.condition_channels` = latents + 1 channels after the noisy
latents') and the image embedding (`encode_image`: SigLIP's last hidden states of the image as its
`SiglipImageProcessor` prepares it). `tokenize`, training and `infer --image` reach both through the
family's spec (`condition_latents`, `image_encoder`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidforge.errors import UserInputError
from vidforge.tokenizers.interface import VideoTokenizer

PROCESSOR = "feature_extractor"  # the pipeline's folder of SiglipImageProcessor's config
PROCESSOR_CONFIG = "preprocessor_config.json"


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


class SiglipImageEncoder:
    """SigLIP's vision tower (`path`: the pipeline's image_encoder/) and its image processor (its config in
    `path`, or in feature_extractor/ beside it, the pipeline's layout): `encode(images)` -> (B, L, width)
    float32, the last hidden states."""

    def __init__(
        self, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        from transformers import SiglipImageProcessor, SiglipVisionModel

        path = Path(path)
        processor = path if (path / PROCESSOR_CONFIG).is_file() else path.parent / PROCESSOR
        if not (path / "config.json").is_file() or not (processor / PROCESSOR_CONFIG).is_file():
            raise UserInputError(
                f"tokenizer.image_encoder={path}: not a SigLIP vision folder with its {PROCESSOR_CONFIG} (in it "
                f"or in {PROCESSOR}/ beside it); point at a HunyuanVideo-1.5 I2V pipeline's image_encoder/"
            )
        self.processor = SiglipImageProcessor.from_pretrained(str(processor))
        self.model = SiglipVisionModel.from_pretrained(str(path), dtype=dtype)
        self.model.eval().requires_grad_(False).to(device)
        self.device = torch.device(device)
        self.width = int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(self, images: list[Any]) -> torch.Tensor:
        """Images (PIL, or (H, W, 3) uint8 arrays) -> (B, L, width) float32."""
        images = [np.ascontiguousarray(i) if isinstance(i, np.ndarray) else i for i in images]
        pixels = self.processor.preprocess(
            images=images, do_resize=True, return_tensors="pt", do_convert_rgb=True
        )
        pixels = pixels.to(device=self.device, dtype=self.model.dtype)
        return self.model(**pixels).last_hidden_state.float()
