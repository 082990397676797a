"""Clip embeddings as data: column-wise array shards beside a run's manifest, read without parsing JSON.

Layout of RUN/embeddings/:
    <shard>.vectors.npy   float32 (n, D) unit vectors
    <shard>.<column>.npy  one value a row (e.g. `duration_s`, `aesthetic`), float32
    <shard>.ids.npy       clip ids (fixed-width unicode), written last: a shard exists once this file does
    index.json            the shards in the run's order, their row counts, D, the embedding model (written
                          when the run finalizes; readers see the run's clips in manifest order)

A `vidforge clip` run writes one shard per finished source, as the source commits, so a killed run keeps
what it finished (each file is renamed into place whole). Every file is an .npy that `np.load(mmap_mode=
"r")` maps, so a reader of millions of clips touches only the pages it reads.

The output of `vidforge dedup` is read here too (`dropped_ids`): `shard` leaves those clips out."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.data.manifest import atomic_path, read_jsonl, stable_id, write_json
from vidforge.errors import UserInputError

EMBEDDINGS_DIR = "embeddings"
INDEX = "index.json"
DROPPED = "dropped.jsonl"
"""`vidforge dedup`'s output: one record per dropped clip (`clip_id`, `duplicate_of`, `similarity`, ...)."""


def shard_name(unit_key: str) -> str:
    """The shard of one unit of work (a source video): named by a hash of its key, so a redone unit
    replaces its own shard."""
    return stable_id(unit_key)


def _save(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)


def write_shard(
    folder: str | os.PathLike,
    name: str,
    ids: Sequence[str],
    vectors: np.ndarray,
    columns: dict[str, Sequence[float]] | None = None,
) -> None:
    """Write one shard (each file atomically, the ids last, so a half-written shard is not one)."""
    folder = Path(folder)
    vectors = np.asarray(vectors, np.float32)
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise ValueError(f"shard {name}: {len(ids)} ids but vectors of shape {vectors.shape}")
    _save(folder / f"{name}.vectors.npy", vectors)
    for column, values in (columns or {}).items():
        _save(folder / f"{name}.{column}.npy", np.asarray(values, np.float32))
    _save(folder / f"{name}.ids.npy", np.asarray(list(ids), dtype=str) if len(ids) else np.zeros(0, "<U1"))


def has_shard(folder: str | os.PathLike, name: str) -> bool:
    return (Path(folder) / f"{name}.ids.npy").is_file()


def write_index(
    folder: str | os.PathLike, names: Sequence[str], model: dict[str, Any], columns: Sequence[str] = ()
) -> dict[str, Any]:
    """List `names` (shards already written) as the store, in this order."""
    folder = Path(folder)
    shards, dim = [], None
    for name in names:
        vectors = np.load(folder / f"{name}.vectors.npy", mmap_mode="r")
        shards.append({"name": name, "rows": int(vectors.shape[0])})
        if vectors.shape[0]:
            dim = int(vectors.shape[1]) if dim is None else dim
    index = {
        "rows": sum(s["rows"] for s in shards),
        "dim": dim,
        "model": model,
        "columns": sorted(columns),
        "shards": shards,
    }
    write_json(folder / INDEX, index)
    return index


def write_store(
    run_dir: str | os.PathLike,
    ids: Sequence[str],
    vectors: np.ndarray,
    model: dict[str, Any],
    columns: dict[str, Sequence[float]] | None = None,
    shard_rows: int = 65536,
) -> Path:
    """A whole store at once (synthetic runs, benchmarks): the same files a clip run writes unit by unit."""
    folder = Path(run_dir) / EMBEDDINGS_DIR
    names = []
    for start in range(0, max(len(ids), 1), shard_rows):
        name = f"part-{start // shard_rows:06d}"
        stop = start + shard_rows
        write_shard(
            folder,
            name,
            ids[start:stop],
            np.asarray(vectors[start:stop]),
            {k: np.asarray(v)[start:stop] for k, v in (columns or {}).items()},
        )
        names.append(name)
    write_index(folder, names, model, list(columns or {}))
    return folder


@dataclass
class EmbeddingStore:
    """One run's store, opened from its index. Arrays are memory-mapped, shard by shard."""

    run_dir: Path
    index: dict[str, Any]
    folder: Path = field(init=False)

    def __post_init__(self) -> None:
        self.folder = self.run_dir / EMBEDDINGS_DIR

    @classmethod
    def open(cls, run_dir: str | os.PathLike) -> EmbeddingStore:
        run_dir = Path(run_dir)
        path = run_dir / EMBEDDINGS_DIR / INDEX
        if not path.is_file():
            raise UserInputError(
                f"{run_dir}: no {EMBEDDINGS_DIR}/{INDEX}; pass a `vidforge clip` output made with "
                "curation.embed=true (rerun clip on it to write the store)"
            )
        return cls(run_dir, json.loads(path.read_text(encoding="utf-8")))

    @property
    def rows(self) -> int:
        return int(self.index["rows"])

    @property
    def dim(self) -> int | None:
        return self.index["dim"]

    @property
    def model(self) -> dict[str, Any]:
        return self.index["model"]

    def has_column(self, name: str) -> bool:
        return name in self.index["columns"]

    def _load(self, shard: str, what: str) -> np.ndarray:
        return np.load(self.folder / f"{shard}.{what}.npy", mmap_mode="r")

    def shards(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, vectors) per shard, in order; vectors memory-mapped."""
        for s in self.index["shards"]:
            yield self._load(s["name"], "ids"), self._load(s["name"], "vectors")

    def ids(self) -> np.ndarray:
        parts = [self._load(s["name"], "ids") for s in self.index["shards"]]
        return np.concatenate(parts) if parts else np.zeros(0, str)

    def vectors(self, out: np.ndarray | None = None) -> np.ndarray:
        """All rows as one float32 (rows, D) array in memory (into `out` when given: no second copy)."""
        out = np.empty((self.rows, self.dim or 0), np.float32) if out is None else out
        row = 0
        for _, vectors in self.shards():
            out[row : row + len(vectors)] = vectors
            row += len(vectors)
        return out

    def column(self, name: str) -> np.ndarray:
        if not self.has_column(name):
            raise UserInputError(f"{self.run_dir}: its embeddings have no `{name}` column")
        parts = [self._load(s["name"], name) for s in self.index["shards"]]
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def dropped_ids(dedup_dir: str | os.PathLike) -> set[str]:
    """The clip ids a `vidforge dedup` output dropped."""
    path = Path(dedup_dir) / DROPPED
    if not path.is_file():
        raise UserInputError(f"--dedup {dedup_dir}: no {DROPPED}; pass the -o folder of `vidforge dedup`")
    return {str(r["clip_id"]) for r in read_jsonl(path)}
