"""One shard's entry in a shard index (`index.json`, written by `shard_index`): its name, split, bucket,
sample count, bytes and sha256. Below the index, the reader and the remote store, which all name shards
by their entries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INDEX = "index.json"


@dataclass(frozen=True)
class ShardEntry:
    name: str
    split: str
    samples: int
    bytes: int
    sha256: str
    bucket: str = "all"
    keys_digest: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
