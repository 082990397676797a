"""The pixel tokenizer and `tokenize` end to end with it: tokenize then decode is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vidforge.data.buckets import resize_crop
from vidforge.data.manifest import read_jsonl
from vidforge.data.media import read_image, read_video
from vidforge.data.shard_index import read_index
from vidforge.data.shard_reader import iter_shard
from vidforge.data.sharding import run as shard
from vidforge.data.testing import make_annotated_dir
from vidforge.profile import load_profile
from vidforge.tokenizers import PixelTokenizer
from vidforge.tokenizers.tokenize import decode
from vidforge.tokenizers.tokenize import run as tokenize


@pytest.mark.parametrize(("ct", "cs", "frames"), [(4, 8, 9), (4, 8, 1), (2, 4, 5), (1, 2, 3)])
def test_pixel_round_trip_is_exact_and_shapes_follow_factors(ct, cs, frames):
    tok = PixelTokenizer(ct, cs)
    video = torch.rand(2, 3, frames, 4 * cs, 2 * cs) * 2 - 1
    z = tok.encode(video)
    assert tuple(z.shape) == (2, 3 * ct * cs * cs, 1 + (frames - 1) // ct, 4, 2)
    assert torch.equal(tok.decode(z), video)
    # Space-to-depth, checked element by element: latent frame 1 (frames 1..ct), channel 0 is pixel
    # (frame 1, row 0, col 0) of colour 0; the next channel is the next column inside the patch.
    if frames > 1:
        assert z[0, 0, 1, 0, 0] == video[0, 0, 1, 0, 0]
        assert z[0, 1, 1, 1, 1] == video[0, 0, 1, cs, cs + 1]


def test_pixel_rejects_frame_counts_that_are_not_4k_plus_1():
    with pytest.raises(ValueError, match="4k\\+1"):
        PixelTokenizer().encode(torch.zeros(1, 3, 6, 8, 8))


def test_tokenize_then_decode_is_exact(tmp_path):
    profile = load_profile(
        None,
        [
            "data.buckets=[[48,64],[64,48],[64,64]]",
            "data.frame_buckets=[1,5,9]",
            "data.val_fraction=0",
            "data.shard_max_samples=3",
            "text_encoder.max_length=16",
            "tokenizer.spatial_compression=4",
        ],
    )
    ann = make_annotated_dir(tmp_path / "ann", videos=3, images=2, rejected=0, frames=(6, 12))
    shard(profile, ann, tmp_path / "shards")
    summary = tokenize(profile, tmp_path / "shards", tmp_path / "latents")
    assert summary.samples == 5 and summary.rejected == 0
    index = read_index(tmp_path / "latents")
    assert index.kind == "latent" and index.meta["tokenizer"]["kind"] == "pixel"
    records = {r["clip_id"]: r for r in read_jsonl(ann / "manifest.jsonl")}
    media_shards = {s.name: s for s in read_index(tmp_path / "shards").shards}
    tok = PixelTokenizer(4, 4)
    for entry in index.shards:
        originals = {
            s["__key__"]: s for s in iter_shard(tmp_path / "shards" / entry.name, media_shards[entry.name])
        }
        for sample in iter_shard(tmp_path / "latents" / entry.name, entry):
            record = records[sample["__key__"]]
            h, w, n = (int(x) for x in sample["json"]["bucket"].split("x"))
            path = ann / record["media"]
            source = read_image(path) if path.suffix != ".mp4" else read_video(path)
            expected = resize_crop(source[:n], h, w)
            assert sample["latent.npy"].shape == (3 * 4 * 16, 1 + (n - 1) // 4, h // 4, w // 4)
            np.testing.assert_array_equal(decode(tok, sample["latent.npy"]), expected)
            original = originals[sample["__key__"]]
            np.testing.assert_array_equal(sample["text_emb.npy"], original["text_emb.npy"])
            np.testing.assert_array_equal(sample["text_mask.npy"], original["text_mask.npy"])
            assert sample["txt"] == original["txt"] == record["caption"]
