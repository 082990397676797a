"""Megatron-Energon metadata beside vidforge shards, so `megatron.energon.get_train_dataset(folder)` loads
them: `.nv-meta/.info.yaml` (samples per shard), `split.yaml` (vidforge's train/val split by shard name)
and each tar's `.tar.idx` are written by Energon's own `BaseWebdatasetFactory.prepare_dataset` (what
`energon prepare` runs). `dataset.yaml`:
- latent shards (`vidforge tokenize`): the sample type `vidforge.data.energon_sample.VideoLatentSample`
  with its field map;
- media shards (`vidforge shard`): a `CrudeWebdataset` (subflavor `vidforge: media`, parts left undecoded),
  because the media member's extension differs per sample (mp4, jpg, png): a field map cannot name it.
  `vidforge.data.energon_sample.MEDIA_COOKER` in a TaskEncoder's `cookers` turns each into a
  `VideoMediaSample` (Energon's preferred way over a sample_loader.py in `.nv-meta`).
Energon is a test extra, not a dependency: without it nothing is written and the shards stay vidforge's
(and webdataset's)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from vidforge.data.shard_index import ShardIndex
from vidforge.files import write_text

log = logging.getLogger("vidforge.data")
META = ".nv-meta"


def energon_available() -> bool:
    try:
        import megatron.energon  # noqa: F401
    except ImportError:
        return False
    return True


def write_nv_meta(index: ShardIndex) -> list[str]:
    """Write Energon's metadata for a local latent or media index; the files written (relative), [] without
    Energon."""
    if not energon_available() or index.kind not in ("latent", "media") or not index.shards:
        return []
    import yaml
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    from vidforge.data.energon_sample import FIELD_MAP

    root = Path(index.root).absolute()
    splits = sorted({s.split for s in index.shards})
    patterns = [
        (split, "^(" + "|".join(re.escape(s.name) for s in index.shards if s.split == split) + ")$")
        for split in splits
    ]
    BaseWebdatasetFactory.prepare_dataset(
        root, [s.name for s in index.shards], split_parts_patterns=patterns, shuffle_seed=None, workers=1
    )
    if index.kind == "latent":
        dataset = {
            "sample_type": {"__module__": "vidforge.data.energon_sample", "__class__": "VideoLatentSample"},
            "field_map": dict(FIELD_MAP),
        }
    else:
        dataset = {
            "__module__": "megatron.energon",
            "__class__": "CrudeWebdataset",
            "subflavors": {"vidforge": "media"},
            "auto_decode": False,  # the cooker reads the parts: video decoding is the task encoder's choice
        }
    write_text(root / META / "dataset.yaml", yaml.safe_dump(dataset, sort_keys=False))
    return [f"{s.name}.idx" for s in index.shards] + [
        f"{META}/{name}" for name in (".info.yaml", "split.yaml", "dataset.yaml")
    ]
