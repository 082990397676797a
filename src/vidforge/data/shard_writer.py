"""Writing WebDataset tar shards: regular-file members with safe names, deterministic headers, written
under a temporary name and renamed when complete, with the sha256 computed while writing.

The tar members are written by webdataset's own `TarWriter` (no encoder: members arrive as bytes; fixed
mtime, owner and mode, so a rerun writes the same bytes). Ours around it, for what it does not do: key and
extension checks, duplicate keys, the atomic rename and the sha256 and byte count on the way (the index's
checksums). Measured with `bench/data_loader.py`-sized samples: the same speed as the tarfile loop it
replaced, within the noise of this machine (see docs/benchmarks.md)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import webdataset

from vidforge.data.manifest import atomic_path

SAFE_KEY = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
SAFE_EXT = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
BLOCK = 512


def safe_key(raw: str) -> str:
    """A sample key WebDataset splits correctly: no dots (the key ends at the first dot of a member name),
    no slashes, nothing a shell or a tar extractor could misread."""
    key = re.sub(r"[^A-Za-z0-9_-]", "_", str(raw))[:80]
    if not key:
        raise ValueError(f"empty sample key from {raw!r}")
    return key


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, default=_jsonable).encode("utf-8")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray | tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def member_bytes(size: int) -> int:
    """Bytes a member of `size` bytes takes in a tar: one header block plus the data padded to 512."""
    return BLOCK + -(-size // BLOCK) * BLOCK


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through (tarfile writes sequentially)."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)


class ShardWriter:
    """One tar shard. `add(key, {ext: bytes})` appends a sample; `close()` renames it into place and
    returns its index entry (name, samples, bytes, sha256). Use as a context manager: an exception
    leaves nothing behind."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._atomic = atomic_path(self.path)
        tmp = self._atomic.__enter__()
        self._file = open(tmp, "wb")
        self._hash = _HashingWriter(self._file)
        self._tar = webdataset.TarWriter(self._hash, user="", group="", mode=0o644, encoder=False, mtime=0)
        self.samples = 0
        self._keys: set[str] = set()

    def add(self, key: str, members: dict[str, bytes]) -> None:
        if not SAFE_KEY.match(key):
            raise ValueError(f"unsafe sample key {key!r}; use safe_key()")
        if key in self._keys:
            raise ValueError(f"duplicate sample key {key!r} in {self.path.name}")
        self._keys.add(key)
        for ext in members:
            if not SAFE_EXT.match(ext):
                raise ValueError(f"unsafe member extension {ext!r}")
        self._tar.write({"__key__": key, **members})
        self.samples += 1

    def close(self) -> dict[str, Any]:
        self._tar.close()
        self._file.close()
        self._atomic.__exit__(None, None, None)
        return {
            "name": self.path.name,
            "samples": self.samples,
            "bytes": self._hash.size,
            "sha256": self._hash.sha.hexdigest(),
        }

    def abort(self) -> None:
        self._tar.close()
        self._file.close()
        self._atomic.__exit__(RuntimeError, RuntimeError("aborted"), None)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
