"""The training loader: exact resume, disjoint data-parallel shards, identical samples in a model-parallel
group, blending by weight, corrupt shards skipped (never yielded), and the shuffle actually shuffling."""

from __future__ import annotations

import json
import logging
from collections import Counter

import numpy as np
import pytest

from vidforge.data.batching import Packer
from vidforge.data.blending import rank_segments, rank_shards
from vidforge.data.loader import DataError, ShardLoader, group_share, merge_shares
from vidforge.data.shard_index import read_index
from vidforge.data.testing import make_latent_shards


@pytest.fixture(scope="module")
def shards_a(tmp_path_factory):
    return make_latent_shards(tmp_path_factory.mktemp("a"), shards=5, per_shard=7, seed=1)


@pytest.fixture(scope="module")
def shards_b(tmp_path_factory):
    return make_latent_shards(tmp_path_factory.mktemp("b"), shards=3, per_shard=4, seed=2, val_shards=1)


def _keys(loader, n):
    out = []
    for sample in loader:
        out.append((str(sample["__shard__"]), sample["__key__"]))
        if len(out) == n:
            break
    return out


def _make(shards_a, shards_b, **kw):
    args = {"seed": 3, "shuffle_buffer": 6, "epochs": None} | kw
    return ShardLoader([(shards_a, 1.0), (shards_b, 2.0)], **args)


@pytest.mark.parametrize("stop", [1, 17, 40, 61])
def test_resume_mid_epoch_continues_exactly(shards_a, shards_b, stop):
    reference = _keys(_make(shards_a, shards_b), 120)  # crosses several epochs of both sources
    first = _make(shards_a, shards_b)
    assert _keys(first, stop) == reference[:stop]
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    resumed = _make(shards_a, shards_b)
    resumed.load_state_dict(state)
    assert _keys(resumed, 120 - stop) == reference[stop:]


def test_packer_resume_continues_exactly(shards_a):
    def batches(packer, n):
        return [(b.keys, b.layout.grids) for _, b in zip(range(n), packer, strict=False)]

    def make():
        return Packer(ShardLoader([shards_a], seed=5, shuffle_buffer=4, epochs=3), (1, 2, 2), 48, buffer=6)

    reference = batches(make(), 30)
    first = make()
    assert batches(first, 11) == reference[:11]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert batches(resumed, 19) == reference[11:]


def test_data_parallel_ranks_read_disjoint_shards_covering_all(shards_a):
    index = read_index(shards_a)
    per_rank = []
    for rank in range(2):
        loader = ShardLoader([shards_a], dp_rank=rank, dp_size=2, epochs=1, shuffle_buffer=3, seed=7)
        per_rank.append({s["__shard__"] for s in loader})
        assert loader.stats["yielded"] == sum(
            index.shards[i].samples for i in rank_shards(5, 7, 0, 0, rank, 2)
        )
    assert not per_rank[0] & per_rank[1]
    assert per_rank[0] | per_rank[1] == {str(index.path(s)) for s in index.shards}


@pytest.mark.parametrize("sizes,ranks", [([9], 2), ([9], 4), ([7, 5], 3), ([3, 1, 4], 5)])
def test_fewer_shards_than_ranks_split_by_sample_covering_each_once(sizes, ranks):
    for epoch in range(3):
        reads = [
            (shard, i)
            for rank in range(ranks)
            for shard, first, end in rank_segments(sizes, 11, 0, epoch, rank, ranks)
            for i in range(first, end)
        ]
        assert sorted(reads) == [(s, i) for s, n in enumerate(sizes) for i in range(n)]  # once each
        counts = [
            sum(e - f for _, f, e in rank_segments(sizes, 11, 0, epoch, r, ranks)) for r in range(ranks)
        ]
        assert max(counts) - min(counts) <= 1  # balanced: every rank takes the same number of steps


def test_two_ranks_on_one_shard_see_disjoint_samples_whose_union_is_one_ranks_across_resume(tmp_path):
    root = make_latent_shards(tmp_path / "one", shards=1, per_shard=9, seed=4)

    def make(rank, size):
        return ShardLoader([root], dp_rank=rank, dp_size=size, epochs=2, shuffle_buffer=3, seed=2)

    def keys(loader, n=10**6):
        return [(s["__ref__"][2], s["__key__"]) for _, s in zip(range(n), loader, strict=False)]

    single = keys(make(0, 1))
    per_rank = []
    for rank in range(2):
        reference = keys(make(rank, 2))
        first = make(rank, 2)
        head = keys(first, 3)
        resumed = make(rank, 2)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert head + keys(resumed) == reference  # the resumed rank continues exactly
        per_rank.append(reference)
    assert not set(per_rank[0]) & set(per_rank[1])  # rank 0 reads 4 samples an epoch, rank 1 the other 5
    assert Counter(per_rank[0]) + Counter(per_rank[1]) == Counter(single)  # each sample once an epoch


def test_epoch_reads_every_sample_once_and_shuffles(shards_a):
    keys = [k for _, k in _keys(ShardLoader([shards_a], epochs=1, shuffle_buffer=8, seed=0), 10**6)]
    assert sorted(keys) == [f"s{i:06d}" for i in range(35)]
    assert keys != sorted(keys)
    other = [k for _, k in _keys(ShardLoader([shards_a], epochs=1, shuffle_buffer=8, seed=1), 10**6)]
    assert other != keys


def test_blending_follows_weights(shards_a, shards_b):
    loader = _make(shards_a, shards_b, shuffle_buffer=1)
    sources = [s["__ref__"][0] for _, s in zip(range(1500), loader, strict=False)]
    share_b = sources.count(1) / len(sources)
    assert abs(share_b - 2 / 3) < 4 * np.sqrt(2 / 9 / 1500)  # 4 sigma of the binomial


def test_val_split_is_separate(shards_b):
    val = [s["__key__"] for s in ShardLoader([shards_b], split="val", epochs=1)]
    train = [s["__key__"] for s in ShardLoader([shards_b], split="train", epochs=1)]
    assert len(val) == 4 and len(train) == 12 and not set(val) & set(train)


def test_group_share_and_merge_reassemble_the_chunk():
    chunk = [f"x{i}" for i in range(7)]
    parts = [[(p, chunk[p]) for p in group_share(7, r, 3)] for r in range(3)]
    assert sorted(p for part in parts for p, _ in part) == list(range(7))
    assert merge_shares(parts, 7) == chunk
    with pytest.raises(RuntimeError):
        merge_shares(parts[:2], 7)


def test_corrupt_and_truncated_shards_are_skipped_and_never_yielded(tmp_path, caplog):
    root = make_latent_shards(tmp_path / "s", shards=4, per_shard=5)
    index = read_index(root)
    truncated, flipped = index.path(index.shards[1]), index.path(index.shards[2])
    truncated.write_bytes(truncated.read_bytes()[:3000])
    data = bytearray(flipped.read_bytes())
    data[600] ^= 0x01  # one bit inside the first sample's latent: decodable, but wrong
    flipped.write_bytes(bytes(data))
    good = {str(index.path(index.shards[i])) for i in (0, 3)}
    with caplog.at_level(logging.WARNING, logger="vidforge.data"):
        loader = ShardLoader([root], epochs=1, shuffle_buffer=4)
        got = list(loader)
    assert {s["__shard__"] for s in got} == good and len(got) == 10
    assert loader.stats["skipped_shards"] == 2
    assert "truncated" in caplog.text or "bytes" in caplog.text
    assert "sha256" in caplog.text
    with pytest.raises(DataError):
        list(ShardLoader([root], epochs=1, on_error="fail"))


def test_undecodable_sample_is_skipped(tmp_path):
    from vidforge.data.manifest import write_json
    from vidforge.data.shard_writer import ShardWriter, npy_bytes

    root = tmp_path / "s"
    with ShardWriter(root / "train-000000.tar") as w:
        w.add("good", {"latent.npy": npy_bytes(np.zeros((4, 1, 2, 2), np.float32)), "json": b"{}"})
        w.add("bad", {"latent.npy": b"\x93NUMPY garbage", "json": b"{}"})
        entry = w.close()
    write_json(
        root / "index.json",
        {
            "format": "vidforge-shards",
            "version": 1,
            "kind": "latent",
            "shards": [{**entry, "split": "train"}],
        },
    )
    loader = ShardLoader([root], epochs=1)
    assert [s["__key__"] for s in loader] == ["good"] and loader.stats["skipped_samples"] == 1
