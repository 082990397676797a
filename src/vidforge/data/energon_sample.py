"""The Megatron-Energon sample types of vidforge's shards: `VideoLatentSample` for latent shards (named by
the `.nv-meta/dataset.yaml` that `vidforge tokenize` writes), `VideoMediaSample` and its `MEDIA_COOKER` for
media shards (`vidforge shard`: a crude dataset). Imports megatron-energon: only Energon's users load this
module, vidforge does not.

    from megatron.energon import WorkerConfig, get_train_dataset
    ds = get_train_dataset("runs/latents", worker_config=WorkerConfig.default_worker_config(),
                           batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None)
    sample = next(iter(ds))    # a VideoLatentSample

    class Encoder(TaskEncoder):  # media shards: cook the crude samples
        cookers = [MEDIA_COOKER]"""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from megatron.energon import Cooker, Sample


@dataclass
class VideoLatentSample(Sample):
    """One sample of a latent shard, decoded by Energon's default decoder (npy, json, txt)."""

    latent: np.ndarray
    """(C, T, H, W) float: the video tokenizer's latent."""
    text_emb: np.ndarray
    """(L, D) float16: the caption's per-token text embedding."""
    text_mask: np.ndarray
    """(L,) bool: which of the L positions hold tokens."""
    caption: str
    meta: dict[str, Any]
    """The sample's record: key, bucket, latent shape, the clip's fields."""


FIELD_MAP = {
    "latent": "latent.npy",
    "text_emb": "text_emb.npy",
    "text_mask": "text_mask.npy",
    "caption": "txt",
    "meta": "json",
}
"""Sample field -> tar member extension, as dataset.yaml's field_map."""


# The members every media sample has beside its one media file (`vidforge.data.sharding.write_shard`).
MEDIA_COMPANIONS = ("json", "txt", "text_emb.npy", "text_mask.npy")


@dataclass
class VideoMediaSample(Sample):
    """One sample of a media shard, its clip or image still encoded (decode with PyAV or PIL as you wish)."""

    media: bytes
    """The clip (H.264 mp4) or image file's bytes."""
    media_ext: str
    """Its extension: mp4, jpg, png, ..."""
    text_emb: np.ndarray
    """(L, D) float16: the caption's per-token text embedding."""
    text_mask: np.ndarray
    """(L,) bool: which of the L positions hold tokens."""
    caption: str
    meta: dict[str, Any]
    """The clip's record (source, frames, seconds, scores)."""


def cook_media(raw: dict) -> VideoMediaSample:
    """A crude media-shard sample (undecoded parts by extension) -> `VideoMediaSample`."""
    (ext,) = [k for k in raw if not k.startswith("__") and k not in MEDIA_COMPANIONS]
    return VideoMediaSample(
        **{f.name: raw.get(f.name) for f in dataclasses.fields(Sample)},  # key, restore key, subflavors
        media=bytes(raw[ext]),
        media_ext=ext,
        text_emb=np.load(io.BytesIO(raw["text_emb.npy"])),
        text_mask=np.load(io.BytesIO(raw["text_mask.npy"])),
        caption=bytes(raw["txt"]).decode("utf-8"),
        meta=json.loads(raw["json"]),
    )


MEDIA_COOKER = Cooker(cook_media, has_subflavors={"vidforge": "media"})
"""For a TaskEncoder's `cookers`: media shards' crude samples -> `VideoMediaSample`."""
