"""Stage 7 (and stitching's model): open-clip image embeddings, normalised.

`ImageEmbedder.from_profile(profile)` loads what `curation.embed_*` names: an open-clip architecture
with a local weights file, a `local-dir:` folder, or, without weights, a randomly initialised model
(seeded, so every process builds the same one). The caption stage reuses this for CLIP similarity
(`embed_text`). torch is imported here and nowhere in the decode/transcode modules."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vidforge.curate.items import ClipPlan, ClipResult
from vidforge.curate.stage import Stage
from vidforge.device import select_device
from vidforge.errors import UserInputError
from vidforge.profile.curation import Curation

TINY = "vidforge-tiny"  # a small CLIP for CPU runs and tests (`clip_score.TINY_CONFIGS`)
_CACHE: dict[tuple, ImageEmbedder] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class ImageEmbedder:
    """An open-clip model in eval mode and the preprocessing it expects."""

    model: object
    tokenizer: object
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    device: str
    name: str
    random_weights: bool

    @classmethod
    def from_profile(cls, profile) -> ImageEmbedder:
        """From a RunProfile (or its `curation` section); shared per process for the same settings."""
        cur = getattr(profile, "curation", profile)
        return cls.load(cur.embed_model, cur.embed_checkpoint, cur.embed_device)

    @classmethod
    def load(
        cls,
        model: str = TINY,
        checkpoint: str | None = None,
        device: str = "auto",
        seed: int = 0,
        shared: bool = True,
    ) -> ImageEmbedder:
        key = (model, checkpoint, device, seed)
        with _CACHE_LOCK:
            if shared and key in _CACHE:
                return _CACHE[key]
            embedder = cls._build(model, checkpoint, device, seed)
            if shared:
                _CACHE[key] = embedder
            return embedder

    @classmethod
    def _build(cls, model_name: str, checkpoint: str | None, device: str, seed: int) -> ImageEmbedder:
        import open_clip
        import torch

        from vidforge.curate.scorers.clip_score import register_tiny_configs

        register_tiny_configs()
        local_dir = model_name.startswith("local-dir:")
        if local_dir and not Path(model_name.removeprefix("local-dir:")).is_dir():
            raise UserInputError(
                f"curation.embed_model={model_name}: no such folder; give an open-clip model folder"
            )
        if not local_dir and model_name not in open_clip.list_models():
            raise UserInputError(
                f"curation.embed_model={model_name!r} is not an open-clip architecture; "
                f"use {TINY}, e.g. ViT-B-32, or local-dir:/path"
            )
        if checkpoint is not None and not Path(checkpoint).is_file():
            raise UserInputError(
                f"curation.embed_checkpoint={checkpoint}: no such file; give a local weights file"
            )
        dev = str(select_device(device, "curation.embed_device"))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # random weights must be the same in every worker and every run
            try:
                # open-clip logs a warning on the root logger for random weights; the run reports it itself
                logging.disable(logging.WARNING)
                model = open_clip.create_model(
                    model_name, pretrained=None if local_dir else checkpoint, device=dev
                )
            except (RuntimeError, KeyError, ValueError) as err:
                raise UserInputError(
                    f"curation.embed_checkpoint={checkpoint}: cannot load it into "
                    f"{model_name} ({str(err).splitlines()[0][:200]})"
                ) from None
            finally:
                logging.disable(logging.NOTSET)
        model.eval()
        size = model.visual.image_size
        size = size[0] if isinstance(size, tuple | list) else int(size)
        mean = tuple(getattr(model.visual, "image_mean", None) or open_clip.OPENAI_DATASET_MEAN)
        std = tuple(getattr(model.visual, "image_std", None) or open_clip.OPENAI_DATASET_STD)
        tokenizer = open_clip.get_tokenizer(model_name)
        random_weights = checkpoint is None and not local_dir
        return cls(model, tokenizer, size, mean, std, dev, model_name, random_weights)

    @property
    def dim(self) -> int:
        return int(self.model.visual.output_dim)

    def describe(self) -> str:
        weights = "random weights (no curation.embed_checkpoint)" if self.random_weights else "local weights"
        return f"open-clip {self.name} on {self.device}, {weights}"

    def preprocess(self, frames: np.ndarray):
        """uint8 (N, H, W, 3) RGB -> normalised (N, 3, S, S) tensor: shorter side to S, centre crop."""
        import torch
        import torch.nn.functional as F

        x = torch.from_numpy(np.ascontiguousarray(frames)).to(self.device).permute(0, 3, 1, 2).float() / 255.0
        h, w = x.shape[-2:]
        scale = self.image_size / min(h, w)
        nh, nw = max(self.image_size, round(h * scale)), max(self.image_size, round(w * scale))
        x = F.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True)
        top, left = (nh - self.image_size) // 2, (nw - self.image_size) // 2
        x = x[..., top : top + self.image_size, left : left + self.image_size]
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        return (x.clamp(0, 1) - mean) / std

    def embed(self, frames: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) uint8 RGB frames -> (N, D) float32 unit vectors."""
        import torch

        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(
                f"embed expects uint8 frames of shape (N, H, W, 3), got {frames.dtype} {frames.shape}"
            )
        if len(frames) == 0:
            return np.zeros((0, self.dim), np.float32)
        with torch.inference_mode():
            features = self.model.encode_image(self.preprocess(frames))
            features = torch.nn.functional.normalize(features.float(), dim=-1)
        return features.cpu().numpy().astype(np.float32)

    def embed_text(self, texts: list[str]) -> np.ndarray:
        """Texts -> (N, D) float32 unit vectors in the same space as `embed`."""
        import torch

        with torch.inference_mode():
            tokens = self.tokenizer(list(texts)).to(self.device)
            features = torch.nn.functional.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return features.cpu().numpy().astype(np.float32)

    def pooled(self, frames: np.ndarray) -> np.ndarray:
        """One (D,) unit vector for a set of frames: the mean of their embeddings, renormalised."""
        return normalise(self.embed(frames).mean(axis=0))


def normalise(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return (v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32)


class EmbedStage(Stage[ClipResult | ClipPlan, ClipResult | ClipPlan]):
    """ClipResult -> ClipResult with `embedding` (mean-pooled, normalised, over its K sampled frames).
    A thread of the driver: one model serves every clip; rejected plans pass through."""

    name = "embed"
    kind = "thread"
    slow_setup = True
    workers = 1
    batch_size = 8
    resources = {"num_cpus": 1}  # noqa: RUF012

    def __init__(self, cfg: Curation):
        self.cfg = cfg
        self.embedder: ImageEmbedder | None = None

    def setup(self) -> None:
        self.embedder = ImageEmbedder.from_profile(self.cfg)

    def process(self, item: ClipResult | ClipPlan) -> ClipResult | ClipPlan:
        samples = getattr(item, "samples", None)
        if samples is None:
            return item
        # One clip's frames per forward pass: batching across clips would change the float summation
        # order, and the embeddings must not depend on which clips happened to arrive together.
        item.embedding = self.embedder.pooled(samples)
        item.samples = None
        return item

    def __getstate__(self):
        return {**self.__dict__, "embedder": None}
