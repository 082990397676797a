"""Reading WebDataset tar shards back: a validated member table per shard (random access by sample index),
sequential iteration, and decoding of members by extension.

A shard is checked before any of its samples is used: a tar that ends inside a member or lacks its
end-of-archive blocks is truncated; a sample count or sha256 that differs from the index is corrupt.
Either raises `ShardError`; the loader logs and skips the shard, or fails, by setting.

Ours, not webdataset's `TarIterator`: webdataset streams a tar front to back, while exact resume needs a
sample by index (a member table of data offsets, then seeks), and its reader checks neither truncation
nor the index's sha256. The shards stay plain WebDataset tars: `webdataset.WebDataset` reads them (tested)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.data.shard_entry import ShardEntry
from vidforge.data.shard_writer import SAFE_EXT, SAFE_KEY


class ShardError(ValueError):
    """A shard that is truncated, corrupt, or does not match its index entry."""


class SampleError(ValueError):
    """One sample whose members cannot be decoded."""


@dataclass(frozen=True)
class SampleMembers:
    key: str
    members: dict[str, tuple[int, int]]  # ext -> (offset of data, size)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            sha.update(block)
    return sha.hexdigest()


def scan_shard(path: str | os.PathLike) -> list[SampleMembers]:
    """The samples of a tar in order, each with its members' data offsets. Raises ShardError for a
    truncated tar, a non-regular or unsafely named member, or a sample split across the tar."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with tarfile.open(path, mode="r:") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ShardError(f"{path.name}: unreadable tar ({err})") from None
    samples: list[SampleMembers] = []
    end = 0
    for m in members:
        if not m.isreg():
            raise ShardError(f"{path.name}: member {m.name!r} is not a regular file")
        key, dot, ext = m.name.partition(".")
        if not dot or not SAFE_KEY.match(key) or not SAFE_EXT.match(ext):
            raise ShardError(f"{path.name}: unsafe member name {m.name!r}")
        end = m.offset_data + m.size
        if end > size:
            raise ShardError(f"{path.name}: truncated inside member {m.name!r} ({size} of {end} bytes)")
        if samples and samples[-1].key == key:
            if ext in samples[-1].members:
                raise ShardError(f"{path.name}: duplicate member {m.name!r}")
            samples[-1].members[ext] = (m.offset_data, m.size)
        else:
            if any(s.key == key for s in samples[-4:]):
                raise ShardError(f"{path.name}: sample {key!r} is not contiguous in the tar")
            samples.append(SampleMembers(key, {ext: (m.offset_data, m.size)}))
    padded_end = -(-end // 512) * 512
    if size < padded_end + 1024:
        raise ShardError(f"{path.name}: truncated (no end-of-archive blocks after the last member)")
    with open(path, "rb") as f:
        f.seek(padded_end)
        if f.read(1024).strip(b"\0"):
            raise ShardError(f"{path.name}: corrupt end of archive")
    return samples


def check_shard(
    path: str | os.PathLike, entry: ShardEntry | None, verify: str = "sha256"
) -> list[SampleMembers]:
    """scan_shard plus the checks against the index entry that `verify` asks for."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"{path.name}: missing")
    if entry is not None and verify == "sha256":
        if path.stat().st_size != entry.bytes:
            raise ShardError(
                f"{path.name}: {path.stat().st_size} bytes, index says {entry.bytes} (truncated?)"
            )
        if sha256_file(path) != entry.sha256:
            raise ShardError(f"{path.name}: sha256 differs from the index (corrupt)")
    samples = scan_shard(path)
    if entry is not None and verify in ("sha256", "count") and len(samples) != entry.samples:
        raise ShardError(f"{path.name}: {len(samples)} samples, index says {entry.samples}")
    return samples


def read_members(path: str | os.PathLike, sample: SampleMembers, f=None) -> dict[str, bytes]:
    own = f is None
    f = open(path, "rb") if own else f
    try:
        out = {}
        for ext, (offset, size) in sample.members.items():
            f.seek(offset)
            data = f.read(size)
            if len(data) != size:
                raise ShardError(f"{Path(path).name}: member {sample.key}.{ext} truncated")
            out[ext] = data
        return out
    finally:
        if own:
            f.close()


_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def load_npy(data: bytes) -> np.ndarray:
    """An `.npy` member, its header held to the member's size before anything is allocated: a header may
    claim any shape (one claiming (48, 3, 40000, 40000) asked for 858 GiB), the bytes cannot. ValueError
    when it is not a plain array of its own size."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    if version not in _NPY_HEADERS:
        raise ValueError(f"npy format version {version[0]}.{version[1]} is not read")
    shape, _, dtype = _NPY_HEADERS[version](f)
    if dtype.hasobject:
        raise ValueError("holds Python objects")
    need, have = math.prod(shape) * dtype.itemsize, len(data) - f.tell()
    if need != have:
        raise ValueError(f"its header says {shape} {dtype} ({need} bytes), the member holds {have} bytes")
    f.seek(0)
    return np.load(f, allow_pickle=False)


def decode_members(key: str, members: dict[str, bytes]) -> dict[str, Any]:
    """json -> dict, txt -> str, npy -> array; media and other members stay bytes. Raises SampleError."""
    out: dict[str, Any] = {"__key__": key}
    for ext, data in members.items():
        try:
            if ext.endswith("npy"):
                out[ext] = load_npy(data)
            elif ext == "json":
                out[ext] = json.loads(data.decode("utf-8"))
            elif ext == "txt":
                out[ext] = data.decode("utf-8")
            else:
                out[ext] = data
        except (ValueError, UnicodeDecodeError, OSError, EOFError) as err:
            raise SampleError(f"{key}.{ext}: undecodable ({err})") from None
    return out


def iter_shard(
    path: str | os.PathLike, entry: ShardEntry | None = None, verify: str = "sha256", decode: bool = True
) -> Iterator[dict[str, Any]]:
    """Every sample of one shard in order (checked first). Raises ShardError / SampleError."""
    samples = check_shard(path, entry, verify)
    with open(path, "rb") as f:
        for s in samples:
            members = read_members(path, s, f)
            yield decode_members(s.key, members) if decode else {"__key__": s.key, **members}
