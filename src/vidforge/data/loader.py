"""The training loader: blended, shuffled, rank-aware, resumable reading of shard directories.

    loader = ShardLoader.from_profile(profile, ["runs/latents"], dp_rank=r, dp_size=n)
    for sample in loader: ...                    # dicts of decoded members: "latent.npy", "text_emb.npy", ...
    state = loader.state_dict()                  # JSON-able; save it with the training checkpoint
    loader.load_state_dict(state)                # a fresh loader continues exactly where this one was

Sample references come from `blending` (a pure function of seed, rank and epoch plus a small state); a
sample is fetched by random access into its shard, whose tar is checked (truncation, sample count,
sha256 by `verify`) before any sample of it is returned. A shard or sample that fails is logged and
skipped, or raises, by `on_error`. Wrong data is never returned silently.

Model-parallel groups (tp x cp x pp ranks that must see identical samples) share a dp_rank, so their
reference streams are identical; a `GroupComm` makes each shard be read once per group: `broadcast`
(group rank 0 reads, sends), `allgather` (each reads every size-th sample of a chunk, all exchange;
NeMo's way) or `each` (every rank reads everything).

Ours rather than webdataset's pipeline (`WebDataset`, `split_by_node`, `shuffle`): its shuffle buffer and
node split keep no state a checkpoint could hold, so a resumed run would not see the same samples; this
loader's position is a small JSON state. `Prefetcher` (`vidforge.data.prefetch`) runs it ahead of the step."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vidforge.data.blending import Blender, Ref, SourceStream
from vidforge.data.media import IMAGE_EXTENSIONS, read_media
from vidforge.data.paths import UnsafePath
from vidforge.data.shard_index import ShardIndex, read_index
from vidforge.data.shard_reader import SampleError, ShardError, check_shard, decode_members, read_members
from vidforge.data.store import StoreSettings
from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.profile.data import VIDEO_EXTENSIONS

log = logging.getLogger("vidforge.data")


class DataError(UserInputError):
    """A shard or sample failed and `on_error` is `fail`: the data is the user's to fix (exit 2)."""


class NoReadableData(UserInputError):
    """Under `on_error: skip`, a whole epoch's worth of references in a row gave no readable sample: every
    shard (or every one left) is unreadable. Skipping on would spin forever without a step."""


def group_share(n: int, group_rank: int, group_size: int) -> list[int]:
    """Positions of a chunk of `n` references that one rank of a model-parallel group reads (allgather)."""
    return list(range(group_rank, n, group_size))


def merge_shares(parts: Sequence[Sequence[tuple[int, Any]]], n: int) -> list[Any]:
    """The chunk in order from every rank's (position, sample-or-None) parts; raises if one is missing."""
    slots: list[Any] = [None] * n
    filled = [False] * n
    for part in parts:
        for pos, sample in part:
            slots[pos], filled[pos] = sample, True
    if not all(filled):
        raise RuntimeError(
            f"model-parallel group exchange lost positions {[i for i, f in enumerate(filled) if not f]}"
        )
    return slots


class GroupComm:
    """The ranks of one model-parallel group (torch.distributed process group), for sample exchange."""

    def __init__(self, group: Any = None, mode: str = "allgather"):
        import torch.distributed as dist

        self.dist, self.group, self.mode = dist, group, mode
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        src = self.dist.get_global_rank(self.group, 0) if self.group is not None else 0
        self.dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]


def _latent_channels(index: ShardIndex) -> int | None:
    tokenizer = index.meta.get("tokenizer")
    channels = tokenizer.get("latent_channels") if isinstance(tokenizer, dict) else None
    return channels if isinstance(channels, int) and not isinstance(channels, bool) else None


def check_latent(sample: dict[str, Any], channels: int | None) -> None:
    """SampleError unless a sample's `latent.npy` can be a latent: (C, T, H, W) floats, all finite, with the
    `channels` of the rest of its source (when its index names them). One bad sample is then skipped like
    a bad shard (`data.on_error`), rather than ending the run as a raw error, a MemoryError, a diverged
    loss blamed on the learning rate, or advice to change model.in_channels to fit it."""
    latent = sample.get("latent.npy")
    if latent is None:
        return
    name = f"{sample['__key__']}.latent.npy"
    if not isinstance(latent, np.ndarray) or latent.ndim != 4:
        raise SampleError(f"{name}: shape {getattr(latent, 'shape', '?')} is not (C, T, H, W)")
    if latent.dtype.kind != "f":
        raise SampleError(f"{name}: {latent.dtype} values, not floats")
    if channels is not None and latent.shape[0] != channels:
        raise SampleError(f"{name}: {latent.shape[0]} channels where its index's tokenizer gives {channels}")
    for ext in ("latent.npy", "text_emb.npy"):
        values = sample.get(ext)
        if isinstance(values, np.ndarray) and values.dtype.kind == "f":
            bad = values.size - int(np.count_nonzero(np.isfinite(values)))
            if bad:
                raise SampleError(
                    f"{sample['__key__']}.{ext}: {bad} of {values.size} values are NaN or infinite (the data, "
                    "not the learning rate)"
                )


def check_text_width(indexes: Sequence[ShardIndex], text_dim: int) -> None:
    """The text embeddings the shards hold are as wide as the model's text input: a mismatch would fail
    inside the first forward (under pp x cp, as hundreds of lines from the pipeline schedule), so say it
    in one line at load, from the width each index.json records for its text encoder."""
    for ix in indexes:
        width = (ix.meta.get("text_encoder") or {}).get("width")
        if width is not None and width != text_dim:
            raise UserInputError(
                f"model.text_dim: {ix.root} holds {width}-wide text embeddings (its index.json's text_encoder), "
                f"the model takes {text_dim}; set --set model.text_dim={width} or re-tokenize with that encoder"
            )


class ShardLoader:
    """See the module docstring. `sources` are shard directories, or (directory, weight) pairs."""

    def __init__(
        self,
        sources: Sequence[str | os.PathLike | tuple[str | os.PathLike, float]],
        *,
        split: str = "train",
        seed: int = 0,
        shuffle_buffer: int = 256,
        epochs: int | None = None,
        dp_rank: int = 0,
        dp_size: int = 1,
        on_error: str = "skip",
        verify: str = "sha256",
        group: GroupComm | None = None,
        decode_media: bool = False,
        cache_shards: int = 64,
        store: Any = None,
    ):
        if not sources:
            raise ValueError("ShardLoader needs at least one source")
        pairs = [(s, 1.0) if not isinstance(s, tuple) else s for s in sources]
        self.indexes: list[ShardIndex] = [read_index(p, store) for p, _ in pairs]
        self.shards = [ix.split(split) for ix in self.indexes]
        streams = []
        for i, (ix, shards) in enumerate(zip(self.indexes, self.shards, strict=True)):
            if not shards:
                raise UserInputError(f"{ix.root}: no shards of split {split!r}")
            streams.append(
                SourceStream(
                    i,
                    [s.samples for s in shards],
                    seed=seed,
                    dp_rank=dp_rank,
                    dp_size=dp_size,
                    shuffle_buffer=shuffle_buffer,
                    epochs=epochs,
                    name=str(ix.root),
                )
            )
        self.blender = Blender(streams, [w for _, w in pairs], seed=seed, dp_rank=dp_rank)
        self.on_error, self.verify, self.group, self.decode_media = on_error, verify, group, decode_media
        # Each source's latent channels as its index says (the tokenizer that wrote it), when it says.
        self._channels = [_latent_channels(ix) for ix in self.indexes]
        self.pending: list[tuple[Ref, dict | None]] = []  # fetched (group exchange) but not yet returned
        self._tables: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._checked: set[tuple[int, int]] = set()
        self._cache_shards = cache_shards
        self.stats = {"yielded": 0, "skipped_samples": 0, "skipped_shards": 0}
        # An epoch's references (every source's samples, all ranks') in a row without a readable sample
        # means nothing readable is left. Counted after the group exchange, so a group's ranks agree.
        self._misses = 0
        self._max_misses = max(1, sum(s.samples for shards in self.shards for s in shards))

    @property
    def epoch_samples(self) -> int:
        """Samples in one pass over every source, all ranks' together."""
        return self._max_misses

    @property
    def mean_sample_bytes(self) -> float:
        """A sample's size in its shards on average, by the indexes (what a decoded sample holds, roughly:
        latents are stored as raw .npy)."""
        shards = [s for source in self.shards for s in source]
        return sum(s.bytes for s in shards) / max(1, sum(s.samples for s in shards))

    @classmethod
    def from_profile(
        cls,
        profile: RunProfile,
        paths: Sequence[str | os.PathLike] = (),
        *,
        split: str = "train",
        dp_rank: int = 0,
        dp_size: int = 1,
        group: GroupComm | None = None,
        decode_media: bool = False,
    ) -> ShardLoader:
        cfg = profile.data
        sources: list[Any] = [(s.path, s.weight) for s in cfg.sources] or [(p, 1.0) for p in paths]
        loader = cls(
            sources,
            split=split,
            seed=cfg.seed,
            shuffle_buffer=cfg.shuffle_buffer,
            epochs=cfg.epochs,
            dp_rank=dp_rank,
            dp_size=dp_size,
            on_error=cfg.on_error,
            verify=cfg.verify,
            group=group,
            decode_media=decode_media,
            store=StoreSettings.from_profile(cfg),
        )
        check_text_width(loader.indexes, profile.model.text_dim)
        return loader

    # --- fetching ---------------------------------------------------------------------------------------

    def _fail(self, message: str, kind: str) -> None:
        if self.on_error == "fail":
            raise DataError(
                f"{message} (data.on_error=fail): regenerate the shard, or set data.on_error=skip to go on without it"
            )
        log.warning("skipping %s: %s", kind, message)
        self.stats[f"skipped_{kind}s"] += 1

    def _table(self, source: int, shard: int) -> Any:
        key = (source, shard)
        if key in self._tables:
            self._tables.move_to_end(key)
            return self._tables[key]
        entry = self.shards[source][shard]
        try:
            path = self.indexes[source].path(entry)
            # a remote shard's sha256 was checked when it entered the cache: hashing it again buys nothing
            first = (
                self.verify
                if self.indexes[source].remote is None
                else ("count" if self.verify == "sha256" else self.verify)
            )
            table = check_shard(path, entry, first if key not in self._checked else "count")
        except (ShardError, UnsafePath) as err:
            table = err
            self._fail(f"{self.indexes[source].root}/{err}", "shard")
        self._checked.add(key)
        self._tables[key] = table
        if len(self._tables) > self._cache_shards:
            self._tables.popitem(last=False)
        return table

    def fetch(self, ref: Ref) -> dict[str, Any] | None:
        """The decoded sample a reference points to, or None when it is skipped (logged)."""
        source, shard, index = ref
        table = self._table(source, shard)
        if isinstance(table, Exception):
            return None  # counted once when the shard failed
        try:  # a remote shard evicted since its check is fetched again
            path = self.indexes[source].path(self.shards[source][shard])
        except (ShardError, UnsafePath) as err:
            self._fail(f"{self.indexes[source].root}/{err}", "sample")
            return None
        if index >= len(table):
            self._fail(f"{path.name}: no sample {index}", "sample")
            return None
        try:
            sample = decode_members(table[index].key, read_members(path, table[index]))
            if self.decode_media:
                media = [e for e in sample if e in IMAGE_EXTENSIONS or e in VIDEO_EXTENSIONS]
                if media:
                    kind = "image" if media[0] in IMAGE_EXTENSIONS else "video"
                    from vidforge.data.media import MediaError

                    try:
                        sample["frames"] = read_media(sample[media[0]], kind)
                    except MediaError as err:
                        raise SampleError(f"{sample['__key__']}.{media[0]}: {err}") from None
            check_latent(sample, self._channels[source])
        except (SampleError, ShardError, OSError) as err:
            self._fail(f"{path.name}: {err}", "sample")
            return None
        sample["__ref__"] = ref
        sample["__shard__"] = str(path)
        return sample

    # --- the stream -------------------------------------------------------------------------------------

    def _refill(self) -> bool:
        """Fetch the next chunk into `pending` (one sample alone, or a group's chunk). False at the end."""
        g = self.group
        size = 1 if g is None or g.mode == "each" else g.size
        refs = []
        for _ in range(size):
            ref = self.blender.next()
            if ref is None:
                break
            refs.append(ref)
        if not refs:
            return False
        if g is None or g.mode == "each":
            samples = [self.fetch(r) for r in refs]
        elif g.mode == "broadcast":
            samples = g.broadcast([self.fetch(r) for r in refs] if g.rank == 0 else None)
        else:
            mine = [(pos, self.fetch(refs[pos])) for pos in group_share(len(refs), g.rank, g.size)]
            samples = merge_shares(g.all_gather(mine), len(refs))
        self.pending.extend(zip(refs, samples, strict=True))
        return True

    def next_sample(self) -> dict[str, Any] | None:
        while True:
            while self.pending:
                _, sample = self.pending.pop(0)
                if sample is not None:
                    self.stats["yielded"] += 1
                    self._misses = 0
                    return sample
                self._misses += 1
                if self._misses >= self._max_misses:
                    raise NoReadableData(self._no_data_message())
            if not self._refill():
                return None

    def _no_data_message(self) -> str:
        roots = ", ".join(str(ix.root) for ix in self.indexes)
        what = "no shard could be read" if not self.stats["yielded"] else "no readable data left"
        return (
            f"{roots}: {what} ({self.stats['skipped_shards']} shard(s) and {self.stats['skipped_samples']} "
            f"sample(s) skipped, {self._misses} references in a row unreadable; the log names each): "
            "regenerate the shards with `vidforge shard`/`vidforge tokenize`, or pass readable ones"
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while (sample := self.next_sample()) is not None:
            yield sample

    # --- resume -----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Exact position: the blender and every source stream, plus samples fetched but not returned."""
        return {
            "version": 1,
            "blender": self.blender.state_dict(),
            "pending": [list(r) for r, _ in self.pending],
            "sources": [str(ix.root) for ix in self.indexes],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.blender.load_state_dict(state["blender"])
        self.pending = [(tuple(r), self.fetch(tuple(r))) for r in state["pending"]]
