"""Clip embeddings as data: column-wise array shards beside a run's manifest, read without parsing JSON.

Layout of RUN/embeddings/:
    <shard>.vectors.npy   float32 (n, D) unit vectors: the clip embeddings (`vidforge clip`'s model)
    <shard>.text.npy      float32 (n, Dt) unit vectors of the clips' captions, zero where a clip has none
                          (only in a `vidforge caption` output whose CLIP model was loaded)
    <shard>.<column>.npy  one value a row, float32, NaN where not measured (`COLUMNS`)
    <shard>.ids.npy       clip ids (fixed-width unicode), written last: a shard exists once this file does
    index.json            the shards in the run's order, their row counts, D, the embedding model, the text
                          model (written when the run finalizes; readers see the run's clips in manifest order)

A `vidforge clip` run writes one shard per finished source, as the source commits, so a killed run keeps
what it finished (each file is renamed into place whole). A `vidforge caption` output writes its store
when it finalizes: its kept clips' vectors (carried from the clip run's store), their captions' text
embeddings and aesthetic scores (`curate.captioning.store`). Every file is an .npy that `np.load(mmap_mode=
"r")` maps, so a reader of millions of clips touches only the pages it reads.

The output of `vidforge dedup` is read here too (`dropped_ids`): `shard` leaves those clips out."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.data.manifest import atomic_path, read_jsonl, stable_id, write_json
from vidforge.errors import UserInputError

EMBEDDINGS_DIR = "embeddings"
INDEX = "index.json"
DROPPED = "dropped.jsonl"
TEXT = "text"
DURATION = "duration_s"
AESTHETIC = "aesthetic"
COLUMNS = {
    DURATION: "the clip's length in seconds (`vidforge clip`, carried by `vidforge caption`)",
    AESTHETIC: "the LAION aesthetic score (`vidforge caption`'s aesthetic filter, its `store_fields`)",
}
"""The store's columns and the stage that writes each (a caption filter's `store_fields` add to it)."""
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
    text: np.ndarray | None = None,
) -> None:
    """Write one shard (each file atomically, the ids last, so a half-written shard is not one)."""
    folder = Path(folder)
    vectors = np.asarray(vectors, np.float32)
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise ValueError(f"shard {name}: {len(ids)} ids but vectors of shape {vectors.shape}")
    if text is not None and (np.ndim(text) != 2 or len(text) != len(ids)):
        raise ValueError(f"shard {name}: {len(ids)} ids but text vectors of shape {np.shape(text)}")
    _save(folder / f"{name}.vectors.npy", vectors)
    if text is not None:
        _save(folder / f"{name}.{TEXT}.npy", np.asarray(text, np.float32))
    for column, values in (columns or {}).items():
        _save(folder / f"{name}.{column}.npy", np.asarray(values, np.float32))
    _save(folder / f"{name}.ids.npy", np.asarray(list(ids), dtype=str) if len(ids) else np.zeros(0, "<U1"))


def has_shard(folder: str | os.PathLike, name: str) -> bool:
    return (Path(folder) / f"{name}.ids.npy").is_file()


def write_index(
    folder: str | os.PathLike,
    names: Sequence[str],
    model: dict[str, Any],
    columns: Sequence[str] = (),
    text_model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """List `names` (shards already written) as the store, in this order. `text_model`: the model of the
    shards' text vectors (None: they have none)."""
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
        "text_model": text_model,
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
    text: np.ndarray | None = None,
    text_model: dict[str, Any] | None = None,
) -> Path:
    """A whole store at once (synthetic runs, benchmarks, a caption output): the same files a clip run
    writes unit by unit, in shards of `shard_rows`. `vectors` and `text` may be anything sliceable by rows
    (`Gathered`), read a shard at a time. Shards of an earlier store in the folder that this one does
    not list are removed."""
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
            None if text is None else np.asarray(text[start:stop]),
        )
        names.append(name)
    write_index(folder, names, model, list(columns or {}), text_model if text is not None else None)
    for stale in folder.glob("part-*.ids.npy"):
        name = stale.name.removesuffix(".ids.npy")
        if name not in names:
            stale.unlink()  # the ids first: from here it is no shard
            for path in folder.glob(f"{name}.*.npy"):
                path.unlink()
    return folder


_REWRITE = "rerun the stage that wrote the store (`vidforge clip` or `vidforge caption`) to rewrite it"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def check_index(path: Path, index: Any) -> dict[str, Any]:
    """`index` (read from `path`) as a store index: its fields of the right types, shard names that are
    plain file names (no folder, no `..`: a name read from data never leaves the store's folder), and
    rows that add up. Returns it; a wrong one is a UserInputError naming `path`."""

    def bad(what: str) -> UserInputError:
        return UserInputError(f"{path}: {what}; {_REWRITE}")

    if not isinstance(index, dict):
        raise bad("not a JSON object")
    for key, kind in (("rows", int), ("shards", list), ("model", dict), ("columns", list)):
        if not isinstance(index.get(key), kind) or isinstance(index.get(key), bool):
            raise bad(f"no `{key}` ({kind.__name__})")
    dim = index.get("dim")
    if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or dim < 1):
        raise bad(f"`dim` {dim!r} is no positive integer")
    if not all(isinstance(c, str) and _PLAIN_NAME.fullmatch(c) for c in index["columns"]):
        raise bad("a column name that is not a plain name")
    for shard in index["shards"]:
        name = shard.get("name") if isinstance(shard, dict) else None
        if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name):
            raise bad(f"shard name {name!r} is not a plain file name in the store's folder")
        rows = shard.get("rows")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise bad(f"shard {name}: rows {rows!r} is no count")
    declared = sum(s["rows"] for s in index["shards"])
    if declared != index["rows"] or index["rows"] < 0:
        raise bad(f"`rows` is {index['rows']} but its shards hold {declared}")
    return index


NpyHeader = tuple[tuple[int, ...], np.dtype, int]
"""(shape, dtype, offset of the data) of an .npy file."""


def npy_header(path: Path) -> NpyHeader:
    """(shape, dtype, offset of the data) from an .npy file's header, held to the file's size: nothing is
    allocated or mapped, so a header claiming millions of rows that the file does not hold is caught here."""
    if not path.is_file():
        raise UserInputError(f"{path}: missing; {_REWRITE}")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as err:
        raise UserInputError(f"{path}: not a readable .npy file ({err}); {_REWRITE}") from None
    if dtype.hasobject or fortran:
        raise UserInputError(
            f"{path}: holds {'objects' if dtype.hasobject else 'a Fortran-order array'}; {_REWRITE}"
        )
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if path.stat().st_size < need:
        raise UserInputError(
            f"{path}: its header declares {shape} {dtype} ({need} bytes) but the file holds "
            f"{path.stat().st_size}; {_REWRITE}"
        )
    return tuple(int(n) for n in shape), dtype, offset


def read_rows(path: Path, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a 2-D .npy file, read (not mapped): a pass over a store of any size keeps
    only the rows in hand in this process's memory, where mapped pages stay resident until unmapped."""
    shape, dtype, offset = npy_header(path)
    stop = min(stop, shape[0])
    width = int(np.prod(shape[1:], dtype=np.int64))
    with open(path, "rb") as f:
        f.seek(offset + start * width * dtype.itemsize)
        rows = np.fromfile(f, dtype, max(0, stop - start) * width)
    return rows.reshape(-1, *shape[1:])


_GATHER_THREADS = 16  # reads in flight: a random 4 KB read waits ~4 ms on a network disk, not for the CPU


@functools.cache
def _readers(pid: int) -> ThreadPoolExecutor:
    """The reading threads of process `pid` (a forked child makes its own: threads do not survive a fork)."""
    return ThreadPoolExecutor(_GATHER_THREADS, thread_name_prefix="gather_rows")


def gather_rows(path: Path, rows: np.ndarray, header: NpyHeader | None = None) -> np.ndarray:
    """Rows `rows` (any order, repeats allowed) of a 2-D .npy file, each read where it lies, with the
    kernel's read-ahead off for the file and the reads in threads. Mapped pages of scattered rows cost
    each row the device's read-around (8 MB on a virtio disk: a thousand times a 2 KB row), which evicts
    the page cache a store larger than it depends on; plain reads cost each row its own pages.
    `header`: the file's `npy_header`, when the caller holds it (a dedup gathers from a shard a million
    times, and parsing the header was ~10% of a 32-row gather)."""
    shape, dtype, offset = header or npy_header(path)
    rows = np.asarray(rows, np.int64)
    wanted, back = np.unique(rows, return_inverse=True)
    if len(wanted) and (wanted[0] < 0 or wanted[-1] >= shape[0]):
        raise IndexError(f"{path}: rows outside 0..{shape[0] - 1}")
    width = int(np.prod(shape[1:], dtype=np.int64))
    size = width * dtype.itemsize
    got = np.empty((len(wanted), width), dtype)
    starts = np.flatnonzero(np.diff(wanted, prepend=-2) != 1)  # runs of consecutive rows: one read each
    ends = np.append(starts[1:], len(wanted))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)

        def read(run: int) -> None:
            a, b = int(starts[run]), int(ends[run])
            into = memoryview(got[a:b]).cast("B")
            done = os.preadv(fd, [into], offset + int(wanted[a]) * size)
            if done != len(into):
                raise OSError(f"{path}: short read ({done} of {len(into)} bytes)")

        if len(starts) > 1:
            list(_readers(os.getpid()).map(read, range(len(starts))))
        elif len(starts):
            read(0)
    finally:
        os.close(fd)
    return got[back].reshape(len(rows), *shape[1:])


def check_store(store: EmbeddingStore) -> dict[str, NpyHeader]:
    """Every shard's files against the index and each other: ids one row per declared row, vectors
    (and text vectors) as many rows and the index's width, each column one value a row; all of them
    files inside the store's folder. Headers only: a store of millions of rows is checked in a
    millisecond per shard. Returns the headers it read, by file name."""
    folder = store.folder.resolve()
    dim = store.index.get("dim")
    text = store.index.get("text_model") is not None
    whats = ["ids", "vectors", *([TEXT] if text else []), *store.index["columns"]]
    headers = {}
    for shard in store.index["shards"]:
        name, rows = shard["name"], shard["rows"]
        for what in whats:
            path = store.folder / f"{name}.{what}.npy"
            if path.exists() and not path.resolve().is_relative_to(folder):
                raise UserInputError(f"{path}: links outside the store's folder {folder}; {_REWRITE}")
            headers[path.name] = npy_header(path)
            got, dtype, _ = headers[path.name]
            if what == "ids":
                ok = dtype.kind == "U" and got == (rows,)
            elif what == "vectors" and rows:
                ok = dtype.kind == "f" and got == (rows, dim)
            elif what in ("vectors", TEXT):
                ok = dtype.kind == "f" and len(got) == 2 and got[0] == rows or got == (0,) == (rows,)
            else:
                ok = dtype.kind == "f" and got == (rows,)
            if not ok:
                width = f" of {dim}-d vectors" if what == "vectors" and dim else ""
                raise UserInputError(
                    f"{path}: {dtype} {got}, the store's index declares {rows} row(s){width}; {_REWRITE}"
                )
    return headers


class RowSource:
    """Shards' arrays seen as one, read by global rows: `take(rows)` gathers any rows, shard by shard."""

    def __init__(self, parts: Sequence[np.ndarray]):
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def take(self, rows: np.ndarray, dim: int) -> np.ndarray:
        """float32 (len(rows), dim); a row of -1 is a zero vector."""
        rows = np.asarray(rows, np.int64)
        out = np.zeros((len(rows), dim), np.float32)
        part = np.searchsorted(self.starts, rows, side="right") - 1
        for p in np.unique(part[rows >= 0]):
            at = np.flatnonzero((part == p) & (rows >= 0))
            out[at] = self.parts[p][rows[at] - self.starts[p]]
        return out


@dataclass
class Gathered:
    """Rows of a `RowSource` in a given order, read when sliced: `write_store` takes it as its vectors
    and reads one shard's rows at a time."""

    source: RowSource
    rows: np.ndarray
    dim: int

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, part: slice) -> np.ndarray:
        return self.source.take(self.rows[part], self.dim)


def positions(ids: np.ndarray, wanted: Sequence[str]) -> np.ndarray:
    """The row of each `wanted` id in `ids` (the last row where an id repeats), -1 where absent. Sorted
    search, no dict of the ids: millions of ids cost their array, not a Python object each."""
    ids = np.asarray(ids)
    wanted = np.asarray(list(wanted), dtype=str)
    if not len(ids) or not len(wanted):
        return np.full(len(wanted), -1, np.int64)
    # Stable sort by id: equal ids keep their order, so the rightmost match is the last written.
    order = np.argsort(ids, kind="stable")
    at = np.searchsorted(ids[order], wanted, side="right") - 1
    found = (at >= 0) & (ids[order][np.maximum(at, 0)] == wanted)
    return np.where(found, order[np.maximum(at, 0)], -1)


@dataclass
class EmbeddingStore:
    """One run's store, opened from its index. Arrays are memory-mapped, shard by shard."""

    run_dir: Path
    index: dict[str, Any]
    folder: Path = field(init=False)
    headers: dict[str, NpyHeader] = field(init=False, default_factory=dict)
    """Every shard file's header by file name, read once when the store is opened (`check_store`)."""

    def __post_init__(self) -> None:
        self.folder = self.run_dir / EMBEDDINGS_DIR

    @classmethod
    def open(cls, run_dir: str | os.PathLike) -> EmbeddingStore:
        """The store of `run_dir`, held to its own index before anything is read by row: the index's
        fields, its shard names (plain names in the store's folder), and every shard file's header
        against the rows and width the index declares (`check_store`). A damaged store is one line
        naming the file and what is wrong, before any allocation."""
        run_dir = Path(run_dir)
        path = run_dir / EMBEDDINGS_DIR / INDEX
        if not path.is_file():
            raise UserInputError(
                f"{run_dir}: no {EMBEDDINGS_DIR}/{INDEX}; pass a `vidforge clip` output made with "
                "curation.embed=true (rerun clip on it to write the store)"
            )
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UserInputError(f"{path}: not a JSON store index ({err}); {_REWRITE}") from None
        store = cls(run_dir, check_index(path, index))
        store.headers = check_store(store)
        return store

    @property
    def rows(self) -> int:
        return int(self.index["rows"])

    @property
    def dim(self) -> int | None:
        return self.index["dim"]

    @property
    def model(self) -> dict[str, Any]:
        return self.index["model"]

    @property
    def text_model(self) -> dict[str, Any] | None:
        """The model of the caption text vectors (None: the store has none)."""
        return self.index.get("text_model")

    def has_column(self, name: str) -> bool:
        return name in self.index["columns"]

    def header(self, shard: str, what: str = "vectors") -> NpyHeader:
        """The header of shard `shard`'s `what` file (`npy_header`), as read when the store was opened."""
        return self.headers[f"{shard}.{what}.npy"]

    def _load(self, shard: str, what: str) -> np.ndarray:
        return np.load(self.folder / f"{shard}.{what}.npy", mmap_mode="r")

    def shards(self, what: str = "vectors") -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, vectors) per shard, in order, memory-mapped: the clip vectors, or with `what="text"` the
        caption text vectors."""
        if what == TEXT and self.text_model is None:
            raise UserInputError(
                f"{self.run_dir}: its embeddings hold no caption text vectors; search a `vidforge caption` "
                "output whose curation.caption.clip model ran (the aesthetic or clip_score filter on)"
            )
        for s in self.index["shards"]:
            yield self._load(s["name"], "ids"), self._load(s["name"], what)

    def row_source(self, what: str = "vectors") -> RowSource:
        """The clip (or `what="text"`: caption text) vectors, read by global row (`RowSource`)."""
        return RowSource([v for _, v in self.shards(what)])

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
