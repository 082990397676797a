"""The Megatron-Energon sample type of vidforge's latent shards (named by the `.nv-meta/dataset.yaml` that
`vidforge tokenize` writes). Imports megatron-energon: only Energon loads this module, vidforge does not.

    from megatron.energon import WorkerConfig, get_train_dataset
    ds = get_train_dataset("runs/latents", worker_config=WorkerConfig.default_worker_config(),
                           batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None)
    sample = next(iter(ds))    # a VideoLatentSample"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from megatron.energon import Sample


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
