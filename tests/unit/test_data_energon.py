"""Megatron-Energon loads the latent shards `vidforge tokenize` writes (its `.nv-meta` written by Energon's
own prepare code), and its samples hold what vidforge's loader reads from the same shards."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import make_latents  # noqa: E402

from vidforge.data.loader import ShardLoader  # noqa: E402

energon = pytest.importorskip("megatron.energon")


def test_get_train_dataset_loads_vidforge_shards(tmp_path):
    from vidforge.data.energon_sample import VideoLatentSample

    root = make_latents(tmp_path)
    assert (root / ".nv-meta" / "dataset.yaml").is_file()
    ours = {s["__key__"]: s for s in ShardLoader([root], epochs=1)}
    worker_config = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = energon.get_train_dataset(
        str(root),
        worker_config=worker_config,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=energon.TaskEncoder(),
    )
    seen = {}
    for sample in energon.get_loader(dataset):
        key = sample.__key__.rsplit("/", 1)[1]
        if key in seen:
            break  # the train dataset repeats: one pass is enough
        seen[key] = sample
    assert set(seen) == set(ours)
    for key, sample in seen.items():
        assert isinstance(sample, VideoLatentSample)
        np.testing.assert_array_equal(sample.latent, ours[key]["latent.npy"])
        np.testing.assert_array_equal(sample.text_emb, ours[key]["text_emb.npy"])
        np.testing.assert_array_equal(sample.text_mask, ours[key]["text_mask.npy"])
        assert sample.caption == ours[key]["txt"] and sample.meta == ours[key]["json"]


def test_media_shards_load_as_a_crude_dataset_with_vidforge_s_cooker(tmp_path):
    """`vidforge shard`'s media shards (clips and images, so the media member's extension varies): Energon's
    crude dataset and `MEDIA_COOKER` give every sample with the bytes, caption and embeddings vidforge wrote."""
    from train_fixtures import train_profile

    from vidforge.data.energon_sample import MEDIA_COOKER, VideoMediaSample
    from vidforge.data.sharding import run as shard_run
    from vidforge.data.testing import make_annotated_dir

    annotated = make_annotated_dir(tmp_path / "annotated", videos=2, images=2, rejected=0, size=(48, 64))
    root = tmp_path / "shards"
    shard_run(train_profile(), annotated, root)
    assert (root / ".nv-meta" / "dataset.yaml").is_file()
    ours = {s["__key__"]: s for s in ShardLoader([root], epochs=1)}

    class Encoder(energon.TaskEncoder):
        cookers = [MEDIA_COOKER]

    dataset = energon.get_train_dataset(
        str(root),
        worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=Encoder(),
    )
    seen = {}
    for sample in energon.get_loader(dataset):
        key = sample.__key__.rsplit("/", 1)[1]
        if key in seen:
            break
        seen[key] = sample
    assert set(seen) == set(ours)
    assert {s.media_ext for s in seen.values()} >= {"mp4", "jpg"}  # clips and images in the same shards
    for key, sample in seen.items():
        assert isinstance(sample, VideoMediaSample)
        assert sample.media == ours[key][sample.media_ext]
        np.testing.assert_array_equal(sample.text_emb, ours[key]["text_emb.npy"])
        np.testing.assert_array_equal(sample.text_mask, ours[key]["text_mask.npy"])
        assert sample.caption == ours[key]["txt"] and sample.meta == ours[key]["json"]
