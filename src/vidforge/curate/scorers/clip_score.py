"""open-clip models from local weights, and the caption-video match: the cosine similarity between a
caption's CLIP text embedding and the clip's frame embeddings, averaged over frames.

`load_open_clip` is the one place models are built: a built-in name with a local checkpoint file, a
`local-dir:` folder (open-clip's own `open_clip_config.json` + weights layout), or random weights when
the profile explicitly allows them. It never downloads."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidforge.errors import UserInputError
from vidforge.files import write_text

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")

# Tiny configurations for demos and tests with random weights (`model: tiny-clip` / `tiny-coca`): the real
# architectures at a few hundred thousand parameters. The CLIP one is 768 wide, like ViT-L/14, so the
# aesthetic head fits it.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-clip": {
        "embed_dim": 768,
        "vision_cfg": {"image_size": 64, "layers": 1, "width": 64, "head_width": 32, "patch_size": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
    },
    "tiny-coca": {
        "embed_dim": 64,
        "vision_cfg": {
            "image_size": 64,
            "layers": 1,
            "width": 64,
            "head_width": 32,
            "patch_size": 16,
            "attentional_pool": True,
            "attn_pooler_heads": 2,
            "output_tokens": True,
        },
        "text_cfg": {
            "context_length": 76,
            "vocab_size": 49408,
            "width": 64,
            "heads": 2,
            "layers": 1,
            "embed_cls": True,
            "output_tokens": True,
        },
        "multimodal_cfg": {
            "context_length": 76,
            "vocab_size": 49408,
            "width": 64,
            "heads": 2,
            "layers": 1,
            "attn_pooler_heads": 2,
        },
        "custom_text": True,
    },
    # `curation.embed_model`'s default (curate/embeddings/embedder.py): a 2-layer ViT on 64 px images, 2-layer text.
    "vidforge-tiny": {
        "embed_dim": 64,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    },
}
_registered = False


def register_tiny_configs() -> None:
    """Make the tiny configs (`tiny-clip`, `tiny-coca`, `vidforge-tiny`) known to open-clip (through its public `add_model_config`)."""
    global _registered
    if _registered:
        return
    import open_clip

    folder = Path(tempfile.mkdtemp(prefix="vidforge-openclip-configs-"))
    for name, cfg in TINY_CONFIGS.items():
        write_text(folder / f"{name}.json", json.dumps(cfg))
    open_clip.add_model_config(folder)
    _registered = True


@dataclass
class LoadedModel:
    model: torch.nn.Module
    preprocess: Any
    tokenizer: Any
    random_weights: bool
    """True when the model was built without loading any weights file."""


def load_open_clip(
    model: str, checkpoint: str | None, *, device: str, random_weights: bool, field: str
) -> LoadedModel:
    """Build an open-clip model from local files. `field` names the profile section in error messages."""
    import open_clip

    if model in TINY_CONFIGS:
        register_tiny_configs()
    if model.startswith("local-dir:"):
        folder = Path(model.removeprefix("local-dir:"))
        if not (folder / "open_clip_config.json").is_file():
            raise UserInputError(
                f"{field}.model: {folder} has no open_clip_config.json; give an open-clip model folder"
            )
        has_weights = any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir())
        if not has_weights and not random_weights:
            raise UserInputError(
                f"{field}.model: {folder} has no weights file; add one, or set curation.caption.random_weights=true "
                "(tests and demos only)"
            )
        name, pretrained, is_random = model, None, not has_weights
    else:
        if model not in open_clip.list_models():
            raise UserInputError(
                f"{field}.model: unknown open-clip model {model!r}; use a built-in name or local-dir:PATH"
            )
        if checkpoint:
            if not Path(checkpoint).is_file():
                raise UserInputError(f"{field}.checkpoint: no such file {checkpoint}")
            name, pretrained, is_random = model, checkpoint, False
        elif random_weights:
            name, pretrained, is_random = model, None, True
        else:
            raise UserInputError(
                f"{field}.checkpoint: no weights for {model}; give a local open-clip checkpoint or a local-dir: model "
                "(nothing is downloaded), or set curation.caption.random_weights=true (tests and demos only)"
            )
    net, _, preprocess = open_clip.create_model_and_transforms(
        name, pretrained=pretrained, device=device, pretrained_text=False, pretrained_image=False
    )
    net.eval()
    return LoadedModel(net, preprocess, open_clip.get_tokenizer(name), is_random)


def preprocess_frames(frames: np.ndarray, preprocess: Any) -> torch.Tensor:
    """(N, H, W, 3) uint8 RGB frames -> the model's input batch, through open-clip's own transform."""
    from PIL import Image

    return torch.stack([preprocess(Image.fromarray(np.ascontiguousarray(f))) for f in frames])


class OpenClipModel:
    """The open-clip model of a settings section (its `model` and `checkpoint`; `field` names the section in
    errors), loaded by the first `setup`, and whether it runs without trained weights."""

    field = ""

    def __init__(self, settings: Any, *, device: str = "cpu", random_weights: bool = False):
        self.settings = settings
        self.device = device
        self.random_allowed = random_weights
        self.loaded: LoadedModel | None = None

    def setup(self) -> None:
        if self.loaded is None:
            self.loaded = load_open_clip(
                self.settings.model,
                self.settings.checkpoint,
                device=self.device,
                random_weights=self.random_allowed,
                field=self.field,
            )

    @property
    def random_weights(self) -> bool:
        return bool(self.loaded and self.loaded.random_weights)


class ClipEmbedder(OpenClipModel):
    """Image and text embeddings (L2-normalised) from one open-clip model."""

    field = "curation.caption.clip"

    @property
    def width(self) -> int:
        assert self.loaded is not None
        return (
            int(self.loaded.model.text_projection.shape[1])
            if hasattr(self.loaded.model, "text_projection")
            else 0
        )

    @torch.no_grad()
    def encode_images(self, frames: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) uint8 -> (N, D) float32, unit length."""
        self.setup()
        assert self.loaded is not None
        out = []
        for start in range(0, len(frames), self.settings.batch_size):
            batch = preprocess_frames(
                frames[start : start + self.settings.batch_size], self.loaded.preprocess
            )
            emb = self.loaded.model.encode_image(batch.to(self.device))
            out.append(torch.nn.functional.normalize(emb.float(), dim=-1).cpu())
        return torch.cat(out).numpy() if out else np.zeros((0, 0), np.float32)

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """Captions -> (M, D) float32, unit length (truncated to the model's context length)."""
        self.setup()
        assert self.loaded is not None
        tokens = self.loaded.tokenizer(texts).to(self.device)
        emb = self.loaded.model.encode_text(tokens)
        return torch.nn.functional.normalize(emb.float(), dim=-1).cpu().numpy()


def clip_similarity(image_embeddings: np.ndarray, text_embedding: np.ndarray) -> float:
    """Mean over frames of the cosine similarity between each frame and the caption (unit vectors)."""
    if len(image_embeddings) == 0:
        return float("nan")
    return float(np.mean(image_embeddings @ text_embedding))
