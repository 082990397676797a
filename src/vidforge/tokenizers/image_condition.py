"""Image-to-video conditioning inputs beside the family's own condition latents (`FamilySpec.condition_latents`,
e.g. `families/wan/image_condition.py`):

- the image embedding (`ImageEncoder`, diffusers' `WanImageToVideoPipeline.encode_image`): the penultimate
  hidden states of a CLIP vision tower (`image_encoder/`) on the image as its `CLIPImageProcessor`
  (`image_processor/`) prepares it;
- the image itself (`load_image`, `preprocess_image`): read as RGB, resized to the video's size (Lanczos,
  no crop) and scaled to [-1, 1] by diffusers' own `VideoProcessor`, as WanImageToVideoPipeline does with
  and without expand_timesteps: the one reader of `vidforge infer --image` for every image-to-video model.

`tokenize` keeps a clip's condition latents and first-frame embedding beside its latents; training and
`vidforge infer --image` read them through these functions, so both condition as the pipeline does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidforge.data.batching import CONDITION, IMAGE_EMB
from vidforge.data.media import rgb
from vidforge.errors import UserInputError
from vidforge.families import FamilySpec, family, load
from vidforge.profile import RunProfile
from vidforge.profile.model import Model
from vidforge.tokenizers.interface import VideoTokenizer

IMAGE_ENCODER = "image_encoder"
IMAGE_PROCESSOR = "image_processor"
PROCESSOR_CONFIG = "preprocessor_config.json"


def load_image(path: str | Path) -> Any:
    """The RGB PIL image at `path`, or a UserInputError naming it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return rgb(image)
    except (OSError, UnidentifiedImageError) as err:
        raise UserInputError(f"--image {path}: not a readable image ({err}); give a PNG or JPEG") from None
    except ValueError as err:
        raise UserInputError(f"--image {path}: {err}; save it as an 8- or 16-bit PNG") from None


def preprocess_image(
    image: Any, height: int, width: int, spatial_compression: int, resample: str = "lanczos"
) -> torch.Tensor:
    """An image (PIL, or (H, W, 3) uint8) -> (1, 3, height, width) float32 in [-1, 1], as the pipeline's
    `video_processor.preprocess` makes it (its processor's `resample` filter: `FamilySpec.image_resample`)."""
    from diffusers.video_processor import VideoProcessor

    processor = VideoProcessor(vae_scale_factor=spatial_compression, resample=resample)
    return processor.preprocess(image, height=height, width=width).float()


def fit_image(
    image: Any, height: int, width: int, spatial_compression: int, spec: FamilySpec | None = None
) -> tuple[torch.Tensor, Any]:
    """(the image as `preprocess_image` makes it at height x width, the image the image encoder reads) as
    the family's pipeline (`spec`; None: Wan's) fits it: `image_fit` "resize" stretches it and encodes it
    as given; "crop" resizes it to cover the size, centre-crops it (diffusers' VideoProcessor.resize,
    resize_mode "crop") and encodes the crop; `image_resample` is the filter; `image_crf` > 0 first
    re-compresses it as one H.264 frame at that CRF, by diffusers' own `apply_image_conditioning_crf`
    (LTX-2's pipelines)."""
    fit, crf, resample = ("resize", 0, "lanczos") if spec is None else (
        spec.image_fit, spec.image_crf, spec.image_resample
    )  # fmt: skip
    if crf:
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf
        from PIL import Image

        image = Image.fromarray(apply_image_conditioning_crf(np.asarray(image.convert("RGB")), crf))
    if fit == "crop":
        from diffusers.video_processor import VideoProcessor

        processor = VideoProcessor(vae_scale_factor=spatial_compression, resample=resample)
        image = processor.resize(image, height=height, width=width, resize_mode="crop")
    return preprocess_image(image, height, width, spatial_compression, resample), image


def build_image_encoder(model: Model, path: str | None, device: torch.device | str) -> Any:
    """The image encoder a model with `image_dim` reads (its family's, `FamilySpec.image_encoder`; CLIP's
    by default) from `path` (tokenizer.image_encoder), checked against model.image_dim."""
    if path is None:
        raise UserInputError(
            f"tokenizer.image_encoder: the model reads a {model.image_dim}-wide image embedding; set it to "
            "the image encoder folder of its published pipeline (its image_encoder/)"
        )
    name = family(model.family).image_encoder
    encoder = (ImageEncoder if name is None else load(name))(path, device)
    if encoder.width != model.image_dim:
        raise UserInputError(
            f"tokenizer.image_encoder: gives {encoder.width}-wide states but the model reads "
            f"model.image_dim={model.image_dim}; use the image encoder the model was trained with"
        )
    return encoder


class ImageEncoder:
    """A vision tower (`path`: a diffusers I2V pipeline's `image_encoder/`) and its image processor (its
    preprocessor config in `path`, or in `PROCESSOR_FOLDER/` beside it, the pipeline's layout):
    `encode(images)` -> (B, L, width) float32. This class is CLIP's, read as WanImageToVideoPipeline's
    `encode_image` reads it (the penultimate hidden states); a family whose pipeline uses another tower
    subclasses it (HunyuanVideo-1.5's SigLIP) and names it in `FamilySpec.image_encoder`."""

    TOWER = "CLIP"
    PROCESSOR_FOLDER = IMAGE_PROCESSOR
    PIPELINE = f"a Wan2.1-I2V diffusers pipeline's {IMAGE_ENCODER}/"

    def __init__(
        self, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        path = Path(path)
        processor = path if (path / PROCESSOR_CONFIG).is_file() else path.parent / self.PROCESSOR_FOLDER
        if not (path / "config.json").is_file() or not (processor / PROCESSOR_CONFIG).is_file():
            raise UserInputError(
                f"tokenizer.image_encoder={path}: not a {self.TOWER} vision folder with its {PROCESSOR_CONFIG} "
                f"(in it or in {self.PROCESSOR_FOLDER}/ beside it); point at {self.PIPELINE}"
            )
        processor_class, model_class = self._classes()
        self.processor = processor_class.from_pretrained(str(processor))
        self.model = model_class.from_pretrained(str(path), dtype=dtype)
        self.model.eval().requires_grad_(False).to(device)
        self.device = torch.device(device)
        self.width = int(self.model.config.hidden_size)

    def _classes(self) -> tuple[Any, Any]:
        from transformers import CLIPImageProcessor, CLIPVisionModel

        return CLIPImageProcessor, CLIPVisionModel

    def _pixels(self, images: list[Any]) -> Any:
        return self.processor(images=images, return_tensors="pt")

    def _states(self, inputs: Any) -> torch.Tensor:
        return self.model(**inputs, output_hidden_states=True).hidden_states[-2]

    @torch.inference_mode()
    def encode(self, images: list[Any]) -> torch.Tensor:
        """Images (PIL, or (H, W, 3) uint8 arrays) -> (B, L, width) float32."""
        images = [np.ascontiguousarray(i) if isinstance(i, np.ndarray) else i for i in images]
        inputs = self._pixels(images).to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        return self._states(inputs).float()


class FirstFrameInputs:
    """What `tokenize` keeps beside an image-to-video model's clips, so training conditions as sampling
    does: each clip's condition latents (its family's `condition_latents` of its first frame, at its own
    frame count) and, for a model with image_dim, its first frame's embedding."""

    def __init__(self, model: Model, tokenizer: VideoTokenizer, image_encoder: str | None) -> None:
        spec = family(model.family)
        if spec.condition_latents is None:
            raise ValueError(
                f"family {model.family}: condition_channels without FamilySpec.condition_latents"
            )
        self.build = load(spec.condition_latents)
        self.tokenizer = tokenizer
        self.channels = model.condition_channels
        self.encoder = (
            build_image_encoder(model, image_encoder, tokenizer.device) if model.image_dim else None
        )

    def __call__(self, video: torch.Tensor, first_frames: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """video (B, 3, F, H, W) in [-1, 1] and its clips' first frames (H, W, 3) uint8 -> per clip its
        members: CONDITION (C', T, h, w) float32 and IMAGE_EMB (L, D) float16."""
        condition = self.build(self.tokenizer, video[:, :, 0], video.shape[2]).float().cpu().numpy()
        if condition.shape[1] != self.channels:
            raise UserInputError(
                f"tokenizer: gives {condition.shape[1]} condition channels but the model reads "
                f"model.condition_channels={self.channels}; tokenize with the VAE the model was trained with"
            )
        members: list[dict[str, np.ndarray]] = [{CONDITION: c} for c in condition]
        if self.encoder is not None:
            embedding = self.encoder.encode(first_frames).to(torch.float16).cpu().numpy()
            for member, e in zip(members, embedding, strict=True):
                member[IMAGE_EMB] = e
        return members


def first_frame_inputs(profile: RunProfile, tokenizer: VideoTokenizer) -> FirstFrameInputs | None:
    """`FirstFrameInputs` for the profile's model; None for a model that samples from text (nothing kept)."""
    if not profile.model.samples_from_image:
        return None
    return FirstFrameInputs(profile.model, tokenizer, profile.tokenizer.image_encoder)
