"""Background loading: prefetching changes no batch (the synchronous batcher's sequence, packed and
bucketed), resumes at what the step consumed rather than what was prefetched, and reports data errors in
the consumer."""

from __future__ import annotations

import json
import time

import pytest
import torch

from vidforge.data.batching import Bucketer, Packer
from vidforge.data.loader import NoReadableData, ShardLoader
from vidforge.data.prefetch import Prefetcher, pin_batch
from vidforge.data.shard_index import read_index
from vidforge.data.testing import make_latent_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_latent_shards(tmp_path_factory.mktemp("p"), shards=3, per_shard=8, seed=6)


def _packer(root):
    return Packer(ShardLoader([root], seed=1, shuffle_buffer=5, epochs=2), (1, 2, 2), 48, buffer=6)


def _bucketer(root):
    return Bucketer(ShardLoader([root], seed=1, shuffle_buffer=5, epochs=2), batch_size=2)


def _seen(batch):
    """Everything a step would read from a batch: keys, shapes and the tensors' values."""
    tensors = [batch.tokens if hasattr(batch, "tokens") else batch.latents, batch.text_emb, batch.text_mask]
    grids = batch.layout.grids if hasattr(batch, "layout") else None
    return batch.keys, grids, [t.tolist() for t in tensors]


def _take(source, n=10**6):
    out = []
    while len(out) < n and (batch := source.next_batch()) is not None:
        out.append(_seen(batch))
    return out


@pytest.mark.parametrize("make", [_packer, _bucketer], ids=["packed", "bucketed"])
def test_prefetching_changes_no_batch(shards, make):
    reference = _take(make(shards))
    assert len(reference) > 10
    for depth in (1, 3):
        assert _take(Prefetcher(make(shards), depth)) == reference


@pytest.mark.parametrize("make", [_packer, _bucketer], ids=["packed", "bucketed"])
@pytest.mark.parametrize("stop", [1, 7])
def test_resume_after_kill_continues_at_what_the_step_consumed(shards, make, stop):
    reference = _take(make(shards))
    first = Prefetcher(make(shards), depth=4)
    assert _take(first, stop) == reference[:stop]
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint holds
    deadline = time.monotonic() + 30
    while not first._queue.full() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.batcher.state_dict() != state  # the worker ran ahead of the consumed position
    first.close()  # the process is gone; a new one resumes from the checkpoint
    resumed = Prefetcher(make(shards), depth=4)
    resumed.load_state_dict(state)
    assert _take(resumed) == reference[stop:]


def test_packing_efficiency_is_of_the_consumed_batches(shards):
    sync, ahead = _packer(shards), Prefetcher(_packer(shards), depth=4)
    for _ in range(3):
        sync.next_batch(), ahead.next_batch()
    assert ahead.efficiency == sync.efficiency


def test_unreadable_data_is_raised_in_the_consumer(tmp_path):
    root = make_latent_shards(tmp_path / "bad", shards=2, per_shard=3)
    index = read_index(root)
    for entry in index.shards:
        path = index.path(entry)
        path.write_bytes(path.read_bytes()[:2000])
    source = Prefetcher(Packer(ShardLoader([root], epochs=None), (1, 2, 2), 48), depth=2)
    with pytest.raises(NoReadableData):
        source.next_batch()
    assert source.next_batch() is None  # ended, not hung


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinned_batches_hold_the_same_values(shards):
    batch = _packer(shards).next_batch()
    pinned = pin_batch(batch)
    assert pinned.tokens.is_pinned() and torch.equal(pinned.tokens, batch.tokens)
