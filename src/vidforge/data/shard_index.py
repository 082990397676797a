"""The shard index (`index.json`), written last by `shard` and `tokenize`: per shard its split, bucket,
sample count, bytes and sha256, plus what produced the embeddings and latents.

    {"format": "vidforge-shards", "version": 1, "kind": "media" | "latent",
     "samples": 120, "bytes": 1234567, "splits": {"train": 118, "val": 2},
     "text_encoder": {...}, "tokenizer": {...},            # tokenizer: latent shards only
     "shards": [{"name": "train-000000.tar", "split": "train", "bucket": "all",
                 "samples": 100, "bytes": 1000448, "sha256": "…", "keys_digest": "…"}, ...]}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidforge.data.manifest import write_json
from vidforge.data.paths import inside, plain_name
from vidforge.data.shard_entry import INDEX, ShardEntry
from vidforge.errors import UserInputError

FORMAT = "vidforge-shards"


@dataclass
class ShardIndex:
    root: Path | str  # a folder, or the URL of a remote one
    kind: str
    shards: list[ShardEntry]
    meta: dict[str, Any] = field(default_factory=dict)
    remote: Any = None  # `vidforge.data.store.RemoteShards` of a remote index: fetches and caches shards

    def split(self, name: str) -> list[ShardEntry]:
        return [s for s in self.shards if s.split == name]

    def path(self, entry: ShardEntry) -> Path:
        """The shard's file; `UnsafePath` when its name (data) is not one file inside the index's folder.
        A remote index's shard is fetched into the local cache and checked (`ShardError` if it fails)."""
        if self.remote is not None:
            plain_name(entry.name, "shard name")
            return self.remote.path(entry)
        return inside(Path(self.root), plain_name(entry.name, "shard name"), "shard name")

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)


def write_index(root: str | os.PathLike, kind: str, shards: list[dict[str, Any]], **meta: Any) -> dict:
    shards = sorted(shards, key=lambda s: s["name"])
    splits: dict[str, int] = {}
    for s in shards:
        splits[s["split"]] = splits.get(s["split"], 0) + s["samples"]
    index = {
        "format": FORMAT,
        "version": 1,
        "kind": kind,
        "samples": sum(s["samples"] for s in shards),
        "bytes": sum(s["bytes"] for s in shards),
        "splits": splits,
        **meta,
        "shards": shards,
    }
    write_json(Path(root) / INDEX, index)
    return index


def read_index(root: str | os.PathLike, store: Any = None) -> ShardIndex:
    """The index of a shard directory, local or at an fsspec URL (read with `store`, a
    `vidforge.data.store.StoreSettings`); a missing or foreign index is a user error naming the fix."""
    from vidforge.data import store as stores

    if stores.is_url(root):
        settings = store or stores.StoreSettings()
        remote = settings.remote(os.fspath(root))
        data = remote.read_index()
        shards = stores.RemoteShards(remote, settings.cache())
        return _parse(data, f"{remote.url}/{INDEX}", remote.url, shards)
    root = Path(root)
    path = root / INDEX
    if not path.is_file():
        raise UserInputError(
            f"{root}: no {INDEX}; pass the output directory of `vidforge shard` or "
            "`vidforge tokenize` (a run that did not finish writes no index: rerun it)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UserInputError(f"{path}: not valid JSON ({err.msg}); rerun the command that wrote it") from None
    return _parse(data, path, root)


def _parse(data: dict[str, Any], path: Any, root: Path | str, remote: Any = None) -> ShardIndex:
    if data.get("format") != FORMAT:
        raise UserInputError(f"{path}: not a vidforge shard index (format {data.get('format')!r})")
    fields = set(ShardEntry.__dataclass_fields__)
    shards = [ShardEntry(**{k: v for k, v in s.items() if k in fields}) for s in data["shards"]]
    meta = {k: v for k, v in data.items() if k != "shards"}
    return ShardIndex(root, data["kind"], shards, meta, remote)
