"""Shard directories on object storage (any fsspec URL: s3://bucket/prefix, gs://..., memory://...).

Reading: `RemoteShards` fetches a shard into a bounded local disk cache (`ShardCache`: least recently used
evicted first, by bytes) and checks its sha256 against the index before handing out its local path; a
mismatch is fetched once more (a torn transfer) and then reported as a `ShardError`, which the loader
skips or fails on like a corrupt local shard. Transient errors (connection, timeout) are retried with
exponential backoff; permanent ones (missing object, missing credentials) become one line saying what to
fix. Cache files are named by their sha256, so ranks on one node share them and a changed dataset never
reads a stale copy.

Writing: `shard` and `tokenize` write into a local staging folder, then `upload` sends each shard and the
index last, after removing the old index first: a reader sees the previous dataset, none, or the new one
whole, never a half-written one."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from vidforge import files
from vidforge.data.shard_entry import INDEX, ShardEntry
from vidforge.errors import UserInputError

log = logging.getLogger("vidforge.data")
T = TypeVar("T")


def is_url(path: str | os.PathLike) -> bool:
    """True for a remote fsspec URL (scheme://...), False for a local path or file://."""
    text = os.fspath(path)
    return "://" in text and not text.startswith("file://")


def _transient(err: BaseException) -> bool:
    """A failure worth retrying: the network, not the request."""
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(err, (ConnectionError, TimeoutError, OSError)):
        return True
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import ReadTimeoutError
    except ImportError:
        return False
    return isinstance(err, (BotoConnectionError, ReadTimeoutError))


def with_retries(call: Callable[[], T], what: str, attempts: int = 4, backoff_s: float = 0.5) -> T:
    """`call()`, retried on transient errors after backoff_s, 2*backoff_s, ... seconds."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as err:
            if attempt + 1 >= attempts or not _transient(err):
                raise
            delay = backoff_s * 2**attempt
            log.warning("%s: %s; retrying in %.1f s", what, err, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _user_error(url: str, err: BaseException) -> UserInputError:
    """One line naming what to fix for a failure to reach `url`."""
    name = type(err).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError") or isinstance(err, PermissionError):
        fix = "set credentials for it (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or data.storage_options)"
    elif isinstance(err, FileNotFoundError):
        fix = "check the bucket and prefix"
    elif _transient(err):
        fix = "check the endpoint (AWS_ENDPOINT_URL or data.storage_options.endpoint_url) and the network"
    else:
        fix = "check the URL and data.storage_options"
    return UserInputError(f"{url}: {name}: {str(err).splitlines()[0] if str(err) else name}; {fix}")


class Remote:
    """A folder at an fsspec URL, with retried, error-mapped operations."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, retries: int = 4):
        import fsspec

        self.url = url.rstrip("/")
        self.retries = retries
        try:
            # a fresh filesystem: fsspec's instance cache would keep credentials the environment has dropped
            options = {"skip_instance_cache": True, **(storage_options or {})}
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **options)
        except (ImportError, ValueError) as err:
            raise UserInputError(f"{url}: {err}; install the fsspec backend for its scheme") from None

    def _call(self, call: Callable[[], T], what: str) -> T:
        where = f"{self.url}/{what}" if what else self.url
        try:
            return with_retries(call, where, self.retries)
        except UserInputError:
            raise
        except Exception as err:
            raise _user_error(where, err) from None

    def read_index(self) -> dict[str, Any]:
        try:
            data = self._call(lambda: self.fs.cat_file(f"{self.root}/{INDEX}"), INDEX)
        except UserInputError as err:
            if "FileNotFoundError" in str(err):
                raise UserInputError(
                    f"{self.url}: no {INDEX}; pass the output of `vidforge shard` or `vidforge tokenize` "
                    "(an upload that did not finish writes no index: rerun it)"
                ) from None
            raise
        try:
            return json.loads(data)
        except json.JSONDecodeError as err:
            raise UserInputError(
                f"{self.url}/{INDEX}: not valid JSON ({err.msg}); rerun the command that wrote it"
            ) from None

    def get(self, name: str, local: Path) -> None:
        self._call(lambda: self.fs.get_file(f"{self.root}/{name}", str(local)), name)

    def put(self, local: Path, name: str) -> None:
        self._call(lambda: self.fs.put_file(str(local), f"{self.root}/{name}"), name)

    def check(self) -> None:
        """Reach the store (bucket listing): a UserInputError naming the fix when it cannot."""
        bucket = self.root.split("/", 1)[0]
        self._call(lambda: self.fs.ls(bucket, detail=False), "")

    def remove(self, name: str) -> None:
        path = f"{self.root}/{name}"
        self._call(lambda: self.fs.rm_file(path) if self.fs.exists(path) else None, name)


class _Torn(Exception):
    """A fetched copy whose sha256 is not the index's."""


class ShardCache:
    """Local copies of remote shards, at most `max_bytes` together (least recently used evicted first)."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int):
        self.folder, self.max_bytes = Path(folder).expanduser(), max_bytes
        self.stats = {"hits": 0, "misses": 0, "refetched": 0, "evicted": 0}

    def _path(self, entry: ShardEntry) -> Path:
        return self.folder / f"{entry.sha256}.tar"

    def fetch(self, remote: Remote, entry: ShardEntry) -> Path:
        """The shard's checked local copy (see the module docstring); ShardError when it stays corrupt."""
        from vidforge.data.shard_reader import ShardError, sha256_file

        path = self._path(entry)
        if path.is_file() and path.stat().st_size == entry.bytes:
            os.utime(path)  # most recently used
            self.stats["hits"] += 1
            return path
        self.stats["misses"] += 1
        self.folder.mkdir(parents=True, exist_ok=True)  # on the first fetch: reading an index writes nothing
        for attempt in range(2):
            try:
                # The temporary is the one writer's (a link planted at its predictable name is removed,
                # not written through); renamed once whole and checked, so another rank reading the
                # cache sees all of it or nothing.
                with files.atomic_path(path, folder_may_link=True) as part:
                    remote.get(entry.name, part)
                    if sha256_file(part) != entry.sha256:
                        raise _Torn
            except _Torn:
                self.stats["refetched"] += attempt == 0
                log.warning("%s/%s: sha256 differs from the index, fetching again", remote.url, entry.name)
                continue
            self._evict(keep=path)
            return path
        raise ShardError(f"{entry.name}: sha256 of the object differs from the index (fetched twice)")

    def _evict(self, keep: Path) -> None:
        # cached shards only: a temporary (a dot name) is another rank's fetch in progress
        cached = [p for p in self.folder.glob("*.tar") if not p.name.startswith(".")]
        cached.sort(key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in cached)
        for p in cached:
            if total <= self.max_bytes:
                break
            if p != keep:
                total -= p.stat().st_size
                p.unlink(missing_ok=True)
                self.stats["evicted"] += 1


@dataclass(frozen=True)
class StoreSettings:
    """Where remote shards are cached and how the storage is reached (the profile's `data` fields)."""

    cache_dir: str = "~/.cache/vidforge"
    cache_bytes: int = 100 << 30
    storage_options: dict[str, Any] = field(default_factory=dict)
    retries: int = 4

    @classmethod
    def from_profile(cls, data: Any) -> StoreSettings:
        return cls(data.cache_dir, data.cache_bytes, dict(data.storage_options), data.io_retries)

    def remote(self, url: str) -> Remote:
        return Remote(url, self.storage_options, self.retries)

    def cache(self) -> ShardCache:
        return ShardCache(Path(self.cache_dir).expanduser() / "shards", self.cache_bytes)


class RemoteShards:
    """The shards of one remote index, fetched through a cache (what `ShardIndex.path` calls)."""

    def __init__(self, remote: Remote, cache: ShardCache):
        self.remote, self.cache = remote, cache

    def path(self, entry: ShardEntry) -> Path:
        return self.cache.fetch(self.remote, entry)


def staged(out: str | os.PathLike, data: Any) -> tuple[Path, Remote | None]:
    """Where a stage writing `out` writes (the folder itself, or for a URL a local staging folder that a
    rerun reuses, so finished shards are not written again) and the remote to upload to (None: local).
    The remote is reached here, so a wrong URL or missing credentials stop the stage before any work."""
    if not is_url(out):
        return Path(out), None
    settings = StoreSettings.from_profile(data)
    remote = settings.remote(os.fspath(out))
    remote.check()
    digest = hashlib.sha256(remote.url.encode()).hexdigest()[:16]
    return Path(settings.cache_dir).expanduser() / "staging" / digest, remote


def upload(stage: Path, remote: Remote, names: Sequence[str], *, finish: bool) -> None:
    """Upload the shards `names` from `stage` (with Energon's `.tar.idx` beside each, where written); with
    `finish`, then the manifests and Energon's `.nv-meta`, and the index last."""
    for name in names:
        for file in (name, f"{name}.idx"):
            if (stage / file).is_file():
                remote.put(stage / file, file)
    if finish:
        extra = ["manifest.jsonl", "errors.jsonl"] + sorted(
            p.relative_to(stage).as_posix() for p in (stage / ".nv-meta").glob("*")
        )
        for name in extra:
            if (stage / name).is_file():
                remote.put(stage / name, name)
        remote.put(stage / INDEX, INDEX)
