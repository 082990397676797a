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
