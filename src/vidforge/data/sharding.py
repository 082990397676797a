"""`vidforge shard`: annotated clips (the output of `vidforge caption`) to WebDataset tar shards.

Per kept clip (or image, a video of one frame) a sample `<key>.<mp4|jpg|png|webp>`, `<key>.json` (the
clip's whole record plus key, split, bucket, probed shape), `<key>.txt` (the caption) and the caption's
per-token text embedding `<key>.text_emb.npy` (L, D) float16 with `<key>.text_mask.npy` (L,) bool.

The plan (which sample goes into which shard) is a pure function of the kept records and the profile:
samples split train/val by a hash of their key, optionally grouped by bucket, sorted by key, cut by
sample count and bytes. Each shard is written under a temporary name and committed to a unit ledger, so
a rerun skips complete shards; `index.json` is written last."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.data.buckets import bucket_label, frame_bucket, resolution_bucket
from vidforge.data.embeddings import dropped_ids
from vidforge.data.energon import write_nv_meta
from vidforge.data.manifest import read_jsonl, stable_id, write_jsonl
from vidforge.data.media import MediaError, media_kind, probe
from vidforge.data.paths import UnsafePath, inside
from vidforge.data.shard_entry import INDEX
from vidforge.data.shard_index import read_index, write_index
from vidforge.data.shard_writer import ShardWriter, json_bytes, member_bytes, npy_bytes, safe_key
from vidforge.data.split import split_of
from vidforge.data.store import staged, upload
from vidforge.data.units import ERRORS, MANIFEST, UnitLedger
from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.profile.overrides import command_line


@dataclass
class PlannedSample:
    key: str
    path: Path
    ext: str
    caption: str
    meta: dict[str, Any]
    bytes: int


@dataclass
class PlannedShard:
    name: str
    split: str
    bucket: str
    samples: list[PlannedSample] = field(default_factory=list)

    @property
    def keys_digest(self) -> str:
        return stable_id(*[s.key for s in self.samples])

    @property
    def unit(self) -> str:
        return f"{self.name}#{self.keys_digest}"


@dataclass
class ShardRunCounts:
    """What a stage that writes shards counts (`shard`, and `tokenize` over shards): shards planned,
    written, skipped as complete on a rerun, samples written and rejected, each rejection's record."""

    shards: int = 0
    written: int = 0
    skipped: int = 0
    samples: int = 0
    rejected: int = 0
    seconds: float = 0.0
    out: str = ""
    errors: list[dict] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        """The leading keys of the stage's summary."""
        return {
            "out": self.out,
            "shards": self.shards,
            "written": self.written,
            "skipped": self.skipped,
            "samples": self.samples,
        }


@dataclass
class ShardSummary(ShardRunCounts):
    train: int = 0
    val: int = 0
    bytes_written: int = 0
    random_weights: list[str] = field(default_factory=list)
    """Models that ran without trained weights (the text encoder of a demo or a test)."""

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "train": self.train,
            "val": self.val,
            "rejected": self.rejected,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "MB/s": round(self.mb_per_s, 2),
            "random_weights": self.random_weights,
        }


def _kept_records(annotated_dir: Path, dropped: set[str] = frozenset()) -> list[dict]:
    manifest = annotated_dir / MANIFEST
    if not manifest.is_file():
        raise UserInputError(
            f"{annotated_dir}: no {MANIFEST}; pass the output directory of `vidforge caption`"
        )
    try:
        records = read_jsonl(manifest)
    except ValueError as err:
        raise UserInputError(str(err)) from None
    if records and not any(
        "media" in r for r in records
    ):  # e.g. `vidforge clip`'s manifest: `path`, no caption
        raise UserInputError(
            f"{annotated_dir}: its records have no captions (`media` paths); "
            f"run `{command_line('vidforge', 'caption', annotated_dir, '-o', 'CAPTIONED')}` first and shard CAPTIONED"
        )
    return [r for r in records if r.get("keep", True) is True and r.get("clip_id") not in dropped]


def plan_shards(
    annotated_dir: str | os.PathLike,
    profile: RunProfile,
    text_shape: tuple[int, int],
    dropped: set[str] = frozenset(),
) -> tuple[list[PlannedShard], list[dict]]:
    """Shards to write and records rejected (unreadable media, missing file, too short for any bucket).
    Clips in `dropped` (a `vidforge dedup` output's) are left out."""
    cfg = profile.data
    annotated_dir = Path(annotated_dir)
    emb_bytes = member_bytes(len(npy_bytes(np.zeros(text_shape, np.float16))))
    mask_bytes = member_bytes(len(npy_bytes(np.zeros(text_shape[:1], bool))))
    samples: dict[tuple[str, str], list[PlannedSample]] = {}
    errors: list[dict] = []
    seen: set[str] = set()
    for record in _kept_records(annotated_dir, dropped):
        media = record.get("media")
        raw_key = record.get("clip_id") or (stable_id(media) if media else None)
        if not media or raw_key is None:
            errors.append({"clip_id": raw_key, "media": media, "reason": "record has no media path"})
            continue
        key = safe_key(raw_key)
        if key in seen:
            errors.append({"clip_id": raw_key, "media": media, "reason": f"duplicate key {key}"})
            continue
        try:
            path = inside(annotated_dir, media, "media")
        except UnsafePath as err:
            errors.append({"clip_id": raw_key, "media": media, "reason": str(err)})
            continue
        kind = media_kind(path, cfg.image_extensions)
        try:
            if not path.is_file():
                raise MediaError("file not found")
            info = probe(path, kind)
        except MediaError as err:
            errors.append({"clip_id": raw_key, "media": media, "reason": str(err)})
            continue
        bucket = "all"
        h_w = resolution_bucket(info["height"], info["width"], cfg.buckets)
        n_frames = frame_bucket(info["frames"], cfg.frame_buckets)
        if cfg.group_by_bucket:
            if n_frames is None:
                errors.append(
                    {
                        "clip_id": raw_key,
                        "media": media,
                        "reason": f"{info['frames']} frames: shorter than every data.frame_buckets",
                    }
                )
                continue
            bucket = bucket_label(*h_w, n_frames)
        seen.add(key)
        split = split_of(key, cfg.val_fraction, cfg.split_seed)
        ext = path.suffix.lower().lstrip(".")
        caption = str(record.get("caption") or "")
        meta = {
            **record,
            "key": key,
            "split": split,
            "bucket": bucket,
            "media_kind": kind,
            "probe": info,
            "resolution_bucket": list(h_w),
            "frame_bucket": n_frames,
        }
        size = (
            member_bytes(path.stat().st_size)
            + member_bytes(len(json_bytes(meta)))
            + member_bytes(len(caption.encode("utf-8")))
            + emb_bytes
            + mask_bytes
        )
        samples.setdefault((split, bucket), []).append(PlannedSample(key, path, ext, caption, meta, size))
    shards: list[PlannedShard] = []
    for split, bucket in sorted(samples):
        group = sorted(samples[(split, bucket)], key=lambda s: s.key)
        prefix = split if not cfg.group_by_bucket else f"{split}-{bucket}"
        current: PlannedShard | None = None
        size = 0
        for s in group:
            full = current is not None and (
                len(current.samples) >= cfg.shard_max_samples or size + s.bytes + 1024 > cfg.shard_max_bytes
            )
            if current is None or full:
                current = PlannedShard(
                    f"{prefix}-{sum(1 for x in shards if x.name.startswith(prefix + '-')):06d}.tar",
                    split,
                    bucket,
                )
                shards.append(current)
                size = 0
            current.samples.append(s)
            size += s.bytes
    return shards, errors


def write_shard(path: Path, shard: PlannedShard, encoder: Any) -> dict[str, Any]:
    """Encode the shard's captions (batched) and write the tar atomically. Returns the index entry."""
    hidden, mask = encoder.encode([s.caption for s in shard.samples])
    with ShardWriter(path) as writer:
        for s, h, m in zip(shard.samples, hidden, mask, strict=True):
            writer.add(
                s.key,
                {
                    s.ext: s.path.read_bytes(),
                    "json": json_bytes(s.meta),
                    "txt": s.caption.encode("utf-8"),
                    "text_emb.npy": npy_bytes(h),
                    "text_mask.npy": npy_bytes(m),
                },
            )
        entry = writer.close()
    return {**entry, "split": shard.split, "bucket": shard.bucket, "keys_digest": shard.keys_digest}


def run(
    profile: RunProfile,
    annotated_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    encoder: Any = None,
    on_shard: Callable[[dict[str, Any], int], None] | None = None,
    dedup: str | os.PathLike | None = None,
) -> ShardSummary:
    """Shard the kept clips of `annotated_dir` into `out` (a folder or an fsspec URL: written in a local
    staging folder, then uploaded, the index last). `on_shard(entry, total)` is called per shard (written
    or skipped). The text encoder is built from the profile unless one is passed. `dedup`: a `vidforge
    dedup` output folder whose dropped clips are left out."""
    target = out
    out, remote = staged(out, profile.data)
    annotated_dir = Path(annotated_dir)
    if not annotated_dir.is_dir():
        raise UserInputError(
            f"{annotated_dir}: not a directory; pass the output directory of `vidforge caption`"
        )
    if out.resolve() == annotated_dir.resolve():
        raise UserInputError(f"-o {out}: must differ from the input directory")
    dropped = dropped_ids(dedup) if dedup is not None else frozenset()
    ledger = UnitLedger(out)
    ledger.recover()  # the folder's lock first: a busy folder is refused before the encoder loads
    if remote is not None:
        remote.remove(INDEX)  # readers see no dataset until the new one is whole
    if encoder is None:
        from vidforge.text import build_text_encoder

        encoder = build_text_encoder(profile)
    started = time.perf_counter()
    shards, errors = plan_shards(annotated_dir, profile, (encoder.max_length, encoder.width), dropped)
    done = {e["unit"]: e["data"] for e in ledger.entries() if e["kind"] == "record"}
    summary = ShardSummary(shards=len(shards), out=str(out), errors=errors, rejected=len(errors))
    summary.random_weights = ["text_encoder"] if encoder.random_weights else []
    entries = []
    for shard in shards:
        path = out / shard.name
        entry = done.get(shard.unit)
        if entry is not None and path.is_file() and path.stat().st_size == entry["bytes"]:
            summary.skipped += 1
        else:
            entry = write_shard(path, shard, encoder)
            ledger.commit(shard.unit, [entry])
            summary.written += 1
            summary.bytes_written += entry["bytes"]
        entries.append(entry)
        summary.samples += entry["samples"]
        setattr(summary, shard.split, getattr(summary, shard.split) + entry["samples"])
        if on_shard is not None:
            on_shard(entry, len(shards))
    planned = {s.name for s in shards}
    for stale in out.glob("*.tar"):  # shards of an earlier plan (the input changed): not in the index
        if stale.name not in planned:
            stale.unlink()
    records = [
        {k: s.meta[k] for k in ("key", "split", "bucket", "media_kind", "caption", "probe") if k in s.meta}
        | {"shard": sh.name}
        for sh in shards
        for s in sh.samples
    ]
    write_jsonl(out / MANIFEST, records)
    write_jsonl(out / ERRORS, errors)
    write_index(
        out,
        "media",
        entries,
        created_by="vidforge shard",
        text_encoder=encoder.describe(),
        source=str(annotated_dir),
    )
    write_nv_meta(read_index(out))  # Energon's metadata, where it is installed (uploaded with the shards)
    if remote is not None:
        upload(out, remote, [s.name for s in shards], finish=True)
        summary.out = str(target)
    summary.seconds = time.perf_counter() - started
    return summary
