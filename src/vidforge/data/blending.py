"""Per-source read order and blending of several sources by weight; deterministic and resumable.

A `SourceStream` turns one shard directory into an endless (or `epochs`-long) stream of sample
references `(source, shard, index)` for one data-parallel rank: each epoch the shards are permuted by
(seed, source, epoch) and dealt round-robin to the ranks, read in order, and passed through a shuffle
buffer. A source with fewer shards than ranks is split by sample instead (as Energon and webdataset's
split_by_node do): the epoch's permuted shards, laid end to end, are cut into one contiguous range of
samples per rank, so one shard trains any number of ranks, each reading only its part. Its whole position is a small JSON-able state (epoch, shard cursor, sample cursor, buffer, RNG),
so a resumed stream continues exactly. The `Blender` picks a source per sample with the weights, from
its own RNG, and carries every source's state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vidforge.errors import UserInputError

Ref = tuple[int, int, int]  # (source, shard index in the source's shard list, sample index in the shard)


class DataParallelSizeChanged(UserInputError):
    """A loader state written by a run with another number of data-parallel ranks: each rank's stream is a
    function of its dp rank and size, so the position cannot carry over."""

    def __init__(self, saved: int, now: int) -> None:
        super().__init__(
            f"the data position was saved with {saved} data-parallel rank(s) and this run has {now}; "
            "resume with the same dp_replicate x dp_shard, or accept that the data starts over"
        )
        self.saved, self.now = saved, now


def rank_shards(num_shards: int, seed: int, source: int, epoch: int, dp_rank: int, dp_size: int) -> list[int]:
    """The shards data-parallel rank `dp_rank` reads in `epoch`, in order: a permutation by (seed, source,
    epoch) dealt round-robin, so ranks read disjoint shards and together read all of them."""
    perm = np.random.default_rng([seed, source, epoch, 0x5EED]).permutation(num_shards)
    return [int(i) for i in perm[dp_rank::dp_size]]


Segment = tuple[int, int, int]  # (shard, first sample, end sample): a run of one shard that a rank reads


def rank_segments(
    sizes: Sequence[int], seed: int, source: int, epoch: int, dp_rank: int, dp_size: int
) -> list[Segment]:
    """What data-parallel rank `dp_rank` reads in `epoch`, in order. Whole shards dealt round-robin when
    every rank can have one (each rank opens only its own shards); otherwise, split by sample, the
    contiguous range [rank*N/size, (rank+1)*N/size) of the epoch's N samples in permuted shard order.
    Either way the ranks' reads are disjoint and together cover every sample once."""
    if len(sizes) >= dp_size:
        return [(s, 0, sizes[s]) for s in rank_shards(len(sizes), seed, source, epoch, dp_rank, dp_size)]
    total = sum(sizes)
    lo, hi = dp_rank * total // dp_size, (dp_rank + 1) * total // dp_size
    segments, offset = [], 0
    for shard in rank_shards(len(sizes), seed, source, epoch, 0, 1):
        first, end = max(lo, offset), min(hi, offset + sizes[shard])
        if first < end:
            segments.append((shard, first - offset, end - offset))
        offset += sizes[shard]
    return segments


def _rng_state(rng: np.random.Generator) -> dict:
    state = rng.bit_generator.state
    return {
        "state": {k: int(v) for k, v in state["state"].items()},
        "has_uint32": state["has_uint32"],
        "uinteger": state["uinteger"],
        "bit_generator": state["bit_generator"],
    }


def _set_rng(rng: np.random.Generator, state: dict) -> None:
    rng.bit_generator.state = state


class SourceStream:
    """Sample references of one source for one data-parallel rank (see the module docstring)."""

    def __init__(
        self,
        source: int,
        shard_sizes: Sequence[int],
        *,
        seed: int = 0,
        dp_rank: int = 0,
        dp_size: int = 1,
        shuffle_buffer: int = 1,
        epochs: int | None = None,
        name: str = "",
    ):
        if sum(shard_sizes) < dp_size:
            raise UserInputError(
                f"source {name or source}: {sum(shard_sizes)} samples for {dp_size} data-parallel ranks; every "
                "rank needs at least one sample: add data or train on fewer ranks"
            )
        self.source, self.sizes, self.seed = source, list(shard_sizes), seed
        self.dp_rank, self.dp_size, self.buffer_size, self.epochs = dp_rank, dp_size, shuffle_buffer, epochs
        # shard_pos: the segment of this epoch's rank_segments being read; sample_pos: samples read of it
        self.epoch, self.shard_pos, self.sample_pos = 0, 0, 0
        self.buffer: list[Ref] = []
        self.rng = np.random.default_rng([seed, source, dp_rank, 0xB0FF])
        self._order_epoch, self._order = -1, []

    def _segments(self) -> list[Segment]:
        if self._order_epoch != self.epoch:
            self._order = rank_segments(
                self.sizes, self.seed, self.source, self.epoch, self.dp_rank, self.dp_size
            )
            self._order_epoch = self.epoch
        return self._order

    def _next_sequential(self) -> Ref | None:
        while True:
            if self.epochs is not None and self.epoch >= self.epochs:
                return None
            order = self._segments()
            if self.shard_pos >= len(order):
                self.epoch, self.shard_pos, self.sample_pos = self.epoch + 1, 0, 0
                continue
            shard, first, end = order[self.shard_pos]
            if first + self.sample_pos >= end:
                self.shard_pos, self.sample_pos = self.shard_pos + 1, 0
                continue
            self.sample_pos += 1
            return (self.source, shard, first + self.sample_pos - 1)

    def next(self) -> Ref | None:
        """The next reference, or None when `epochs` are done and the buffer is empty."""
        while len(self.buffer) < self.buffer_size:
            ref = self._next_sequential()
            if ref is None:
                break
            self.buffer.append(ref)
        if not self.buffer:
            return None
        j = int(self.rng.integers(len(self.buffer)))
        self.buffer[j], self.buffer[-1] = self.buffer[-1], self.buffer[j]
        return self.buffer.pop()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "shard_pos": self.shard_pos,
            "sample_pos": self.sample_pos,
            "buffer": [list(r) for r in self.buffer],
            "rng": _rng_state(self.rng),
            "shards": len(self.sizes),
            "dp": [self.dp_rank, self.dp_size],
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = (len(self.sizes), [self.dp_rank, self.dp_size], self.seed)
        theirs = (state["shards"], list(state["dp"]), state["seed"])
        if (mine[0], mine[2]) == (theirs[0], theirs[2]) and mine[1][1] != theirs[1][1]:
            raise DataParallelSizeChanged(theirs[1][1], self.dp_size)
        if mine != theirs:
            raise UserInputError(
                f"loader state is of another setup (shards, dp rank/size, seed) {theirs}, this loader "
                f"has {mine}; resume with the same data, layout and data.seed"
            )
        self.epoch, self.shard_pos, self.sample_pos = state["epoch"], state["shard_pos"], state["sample_pos"]
        self.buffer = [tuple(r) for r in state["buffer"]]
        _set_rng(self.rng, state["rng"])


class Blender:
    """Draws each sample's source with probability proportional to its weight (sources that ended drop out)."""

    def __init__(
        self, streams: Sequence[SourceStream], weights: Sequence[float], seed: int = 0, dp_rank: int = 0
    ):
        if len(streams) != len(weights) or not streams:
            raise ValueError("one weight per source, at least one source")
        self.streams, self.weights = list(streams), np.asarray(weights, dtype=np.float64)
        self.active = [True] * len(streams)
        self.rng = np.random.default_rng([seed, dp_rank, 0xB1E4D])

    def next(self) -> Ref | None:
        while any(self.active):
            if len(self.streams) == 1:
                i = 0
            else:
                w = self.weights * np.asarray(self.active)
                i = int(self.rng.choice(len(w), p=w / w.sum()))
            ref = self.streams[i].next()
            if ref is not None:
                return ref
            self.active[i] = False
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": _rng_state(self.rng),
            "active": list(self.active),
            "streams": [s.state_dict() for s in self.streams],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["streams"]) != len(self.streams):
            raise UserInputError(
                f"loader state has {len(state['streams'])} sources, this loader {len(self.streams)}"
            )
        _set_rng(self.rng, state["rng"])
        self.active = list(state["active"])
        for s, st in zip(self.streams, state["streams"], strict=True):
            s.load_state_dict(st)
