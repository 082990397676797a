"""`vidforge shard` (library level): shards read back with the webdataset library give the samples and
embeddings written; truncated and corrupt tars are detected; reruns skip complete shards."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from vidforge.data.manifest import read_jsonl
from vidforge.data.media import read_image, read_video
from vidforge.data.shard_index import read_index
from vidforge.data.shard_reader import ShardError, check_shard, iter_shard
from vidforge.data.sharding import run
from vidforge.data.split import split_of
from vidforge.data.testing import make_annotated_dir
from vidforge.profile import load_profile
from vidforge.text import build_text_encoder


@pytest.fixture(scope="module")
def profile():
    return load_profile(
        None, ["data.shard_max_samples=3", "data.val_fraction=0.25", "text_encoder.max_length=24"]
    )


@pytest.fixture(scope="module")
def encoder(profile):
    return build_text_encoder(profile)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, profile, encoder):
    ann = make_annotated_dir(tmp_path_factory.mktemp("ann"), videos=5, images=3, rejected=1)
    out = tmp_path_factory.mktemp("shards")
    summary = run(profile, ann, out, encoder=encoder)
    return ann, out, summary


def test_shards_read_back_with_webdataset_equal_what_was_written(sharded, encoder):
    import webdataset as wds

    ann, out, summary = sharded
    index = read_index(out)
    kept = {r["clip_id"]: r for r in read_jsonl(ann / "manifest.jsonl") if r["keep"]}
    assert summary.samples == index.samples == len(kept) == 8 and summary.rejected == 0
    urls = [str(out / s.name) for s in index.shards]
    seen = {}
    for sample in wds.WebDataset(urls, shardshuffle=False).decode("rgb8"):
        key = sample["__key__"]
        record = kept[key]
        meta = sample["json"]
        assert meta["caption"] == record["caption"] == sample["txt"]
        assert meta["split"] == split_of(key, 0.25)
        # The embedding is the encoder's output for this caption, encoded alone (independent of batching).
        hidden, mask = encoder.encode([record["caption"]])
        np.testing.assert_allclose(
            sample["text_emb.npy"].astype(np.float32), hidden[0].astype(np.float32), atol=2e-3
        )
        np.testing.assert_array_equal(sample["text_mask.npy"], mask[0])
        assert sample["text_emb.npy"].dtype == np.float16 and sample["text_emb.npy"].shape == (
            24,
            encoder.width,
        )
        media_ext = Path(record["media"]).suffix[1:]
        raw = (ann / record["media"]).read_bytes()
        member = [k for k in sample if k in ("mp4", "png", "jpg", "webp")]
        assert member == [media_ext]
        if media_ext == "mp4":  # webdataset leaves video bytes undecoded
            assert sample["mp4"] == raw
            assert read_video(sample["mp4"]).shape[0] == record["frames"]
        else:  # webdataset decodes images ("rgb8": HWC uint8); compare pixels with the source file
            np.testing.assert_array_equal(sample[media_ext], read_image(raw)[0])
        seen[key] = sample
    assert set(seen) == set(kept)


def test_index_entries_match_files(sharded):
    import hashlib

    _, out, _ = sharded
    index = read_index(out)
    assert [s.split for s in index.shards].count("val") >= 1
    for s in index.shards:
        data = (out / s.name).read_bytes()
        assert len(data) == s.bytes and hashlib.sha256(data).hexdigest() == s.sha256
        with tarfile.open(out / s.name) as tar:
            members = tar.getmembers()
        assert all(m.isreg() and "/" not in m.name and m.name.count(".") >= 1 for m in members)
        assert len({m.name.split(".")[0] for m in members}) == s.samples <= 3


def test_rerun_skips_complete_shards_and_rewrites_a_missing_one(sharded, profile, encoder):
    ann, out, _ = sharded
    index = read_index(out)
    before = {s.name: (out / s.name).stat().st_mtime_ns for s in index.shards}
    victim = index.shards[0].name
    (out / victim).unlink()
    summary = run(profile, ann, out, encoder=encoder)
    assert summary.written == 1 and summary.skipped == len(before) - 1
    after = read_index(out)
    assert [s.sha256 for s in after.shards] == [s.sha256 for s in index.shards]  # deterministic bytes
    for name, mtime in before.items():
        if name != victim:
            assert (out / name).stat().st_mtime_ns == mtime


def test_truncated_tar_is_detected(sharded, tmp_path):
    _, out, _ = sharded
    entry = read_index(out).shards[0]
    data = (out / entry.name).read_bytes()
    for cut in (len(data) - 1024 * 8, 1536, len(data) // 2 + 7):  # at a block boundary, mid-member, odd
        bad = tmp_path / f"cut{cut}.tar"
        bad.write_bytes(data[:cut])
        with pytest.raises(ShardError):
            check_shard(bad, None, verify="none")  # detected from the tar alone, without the index
    flipped = bytearray(data)
    flipped[700] ^= 0xFF  # inside the first member's data: only the checksum can tell
    bad = tmp_path / entry.name
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ShardError, match="sha256"):
        check_shard(bad, entry, verify="sha256")
    assert len(list(iter_shard(out / entry.name, entry))) == entry.samples


def test_unsafe_member_names_are_refused(tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("../escape.json")
        payload = json.dumps({}).encode()
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(ShardError, match="unsafe"):
        check_shard(bad, None, verify="none")


def test_unreadable_media_is_rejected_not_sharded(tmp_path, profile, encoder):
    ann = make_annotated_dir(tmp_path / "ann", videos=2, images=1, rejected=0)
    records = read_jsonl(ann / "manifest.jsonl")
    (ann / records[0]["media"]).write_bytes(b"not a video")
    summary = run(profile, ann, tmp_path / "out", encoder=encoder)
    assert summary.rejected == 1 and summary.samples == 2
    errors = read_jsonl(tmp_path / "out" / "errors.jsonl")
    assert errors[0]["clip_id"] == records[0]["clip_id"]


def test_group_by_bucket_puts_one_bucket_per_shard(tmp_path, encoder):
    ann = make_annotated_dir(tmp_path / "ann", videos=4, images=2, rejected=0, frames=(9, 20))
    profile = load_profile(
        None,
        [
            "data.group_by_bucket=true",
            "data.frame_buckets=[1,9,17]",
            "data.buckets=[[48,64],[64,48],[64,64]]",
            "data.val_fraction=0",
        ],
    )
    run(profile, ann, tmp_path / "out", encoder=encoder)
    for entry in read_index(tmp_path / "out").shards:
        metas = [s["json"] for s in iter_shard(tmp_path / "out" / entry.name, entry)]
        assert {m["bucket"] for m in metas} == {entry.bucket}
        assert entry.name.startswith(f"train-{entry.bucket}-")
        h, w, n = (int(x) for x in entry.bucket.split("x"))
        assert all(m["probe"]["frames"] >= n for m in metas)
