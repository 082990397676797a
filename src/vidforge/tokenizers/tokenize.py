"""`vidforge tokenize`: media shards (from `vidforge shard`) to latent shards for training.

Per sample: decode the clip or image, pick its bucket (nearest aspect, longest 4k+1 frame count it fills),
resize and centre-crop there, encode with the profile's tokenizer, and write `<key>.latent.npy`
(C, T, H, W) float32 with the text embedding, mask, caption and metadata carried over. The index is
written last, as for `shard`.

Throughput: background threads read, decode and resize the next clips (`tokenizer.prefetch`) and a
writer thread appends to the tar, so the encoder (the GPU) never waits on them. Under torchrun each rank
takes a disjoint set of shards (rank::world); rank 0 writes the index after a barrier."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidforge.data.buckets import bucket_label, frame_bucket, resize_crop, resolution_bucket
from vidforge.data.energon import write_nv_meta
from vidforge.data.media import MediaError, media_kind, read_media
from vidforge.data.paths import UnsafePath, inside, plain_name
from vidforge.data.shard_entry import INDEX, ShardEntry
from vidforge.data.shard_index import ShardIndex, read_index, write_index
from vidforge.data.shard_reader import SampleMembers, ShardError, check_shard, read_members
from vidforge.data.shard_writer import ShardWriter, json_bytes, npy_bytes
from vidforge.data.sharding import ShardRunCounts
from vidforge.data.store import StoreSettings, is_url, staged, upload
from vidforge.data.units import UnitLedger
from vidforge.errors import UserInputError
from vidforge.memory import host_memory_bytes, require
from vidforge.parallel.runtime import Runtime, init_runtime
from vidforge.profile import RunProfile
from vidforge.profile.data import Data
from vidforge.tokenizers.base import build_tokenizer
from vidforge.tokenizers.image_condition import first_frame_inputs
from vidforge.tokenizers.interface import VideoTokenizer, frames_to_tensor, tensor_to_frames

CARRIED = ("text_emb.npy", "text_mask.npy", "txt")


@dataclass
class TokenizeSummary(ShardRunCounts):
    encode_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "rejected": self.rejected,
            "seconds": round(self.seconds, 3),
            "clips/s": round(self.samples / self.seconds, 3) if self.seconds else 0.0,
            "encode clips/s": round(self.samples / self.encode_seconds, 3) if self.encode_seconds else 0.0,
        }


@dataclass
class Prepared:
    key: str
    video: np.ndarray | None  # (F, H, W, 3) uint8 at the bucket's size
    members: dict[str, bytes]
    meta: dict[str, Any]
    error: str | None = None


def prepare(path: Path, sample: SampleMembers, data_cfg: Data) -> Prepared:
    """Read one sample's members, decode its media and fit it to its bucket (runs in a worker thread)."""
    import json

    members = read_members(path, sample)
    meta = json.loads(members.get("json", b"{}"))
    media = [e for e in members if e not in CARRIED and e != "json"]
    if not media:
        return Prepared(sample.key, None, members, meta, "no media member")
    kind = media_kind(f"x.{media[0]}", data_cfg.image_extensions)
    n = max(data_cfg.frame_buckets)
    try:
        frames = read_media(members[media[0]], kind, max_frames=n)
    except MediaError as err:
        return Prepared(sample.key, None, members, meta, str(err))
    f, h, w, _ = frames.shape
    frames_used = frame_bucket(f, data_cfg.frame_buckets)
    if frames_used is None:
        return Prepared(sample.key, None, members, meta, f"{f} frames: shorter than every data.frame_buckets")
    bh, bw = resolution_bucket(h, w, data_cfg.buckets)
    video = resize_crop(frames[:frames_used], bh, bw)
    meta = {
        **meta,
        "bucket": bucket_label(bh, bw, frames_used),
        "frames_used": frames_used,
        "source_size": [h, w],
        "source_frames": f,
    }
    return Prepared(sample.key, video, members, meta)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tokenize_shard(
    in_path: Path,
    entry: ShardEntry,
    out_path: Path,
    tokenizer: VideoTokenizer,
    profile: RunProfile,
    pool: ThreadPoolExecutor,
    on_samples: Callable[[int], None] | None = None,
) -> tuple[dict, list[dict], float]:
    """One media shard to one latent shard. Returns (index entry, rejected samples, seconds encoding).
    `on_samples(n)`: n more samples encoded or rejected (a shard of large clips takes minutes)."""
    advance = on_samples or (lambda n: None)
    samples = check_shard(in_path, entry, "sha256")
    prefetch = max(1, profile.tokenizer.prefetch)
    batch_size = profile.tokenizer.batch_size
    errors: list[dict] = []
    encode_s = 0.0
    image_inputs = first_frame_inputs(profile, tokenizer)  # image-to-video: what training conditions on
    queue: deque[Future] = deque()
    it = iter(samples)

    def top_up() -> None:
        while len(queue) < prefetch + batch_size and (s := next(it, None)) is not None:
            queue.append(pool.submit(prepare, in_path, s, profile.data))

    with ShardWriter(out_path) as writer, ThreadPoolExecutor(1, thread_name_prefix="vf-write") as write_pool:
        writes: list[Future] = []

        def write(p: Prepared, latent: np.ndarray, extra: dict[str, np.ndarray]) -> None:
            meta = {**p.meta, "latent_shape": list(latent.shape), "tokenizer": tokenizer.describe()["kind"]}
            members = {"latent.npy": npy_bytes(latent), "json": json_bytes(meta)}
            members.update({name: npy_bytes(array) for name, array in extra.items()})
            members.update({k: p.members[k] for k in CARRIED if k in p.members})
            writer.add(p.key, members)

        top_up()
        while queue:
            batch: list[Prepared] = []
            while queue and len(batch) < batch_size:
                p = queue.popleft().result()
                top_up()
                if p.error is not None:
                    errors.append({"shard": entry.name, "key": p.key, "reason": p.error})
                    advance(1)
                    continue
                if batch and p.video.shape != batch[0].video.shape:
                    queue.appendleft(_done(p))
                    break
                batch.append(p)
            if not batch:
                continue
            video = torch.stack([frames_to_tensor(p.video) for p in batch]).to(
                tokenizer.device, non_blocking=True
            )
            _sync(tokenizer.device)
            t0 = time.perf_counter()
            latents = tokenizer.encode(video)
            extras: list[dict[str, np.ndarray]] = [{} for _ in batch]
            if image_inputs is not None:
                extras = image_inputs(video, [p.video[0] for p in batch])
            _sync(tokenizer.device)
            encode_s += time.perf_counter() - t0
            latents = latents.float().cpu().numpy()
            for p, latent, extra in zip(batch, latents, extras, strict=True):
                writes.append(write_pool.submit(write, p, latent, extra))
            advance(len(batch))
        for w in writes:
            w.result()  # re-raise a failed write
        result = writer.close()
    return (
        {**result, "split": entry.split, "bucket": entry.bucket, "keys_digest": entry.keys_digest},
        errors,
        encode_s,
    )


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


@contextmanager
def runtime_scope(profile: RunProfile) -> Iterator[Runtime]:
    """This process's runtime (device from tokenizer.device: `cuda:LOCAL_RANK` under torchrun); a process
    group it starts is left on the way out. A group left to interpreter exit can abort the process after
    the work is done (gloo's threads are torn down while still joinable: "terminate called without an
    active exception")."""
    import torch.distributed as dist

    started = not dist.is_initialized()
    runtime = init_runtime(profile, device=profile.tokenizer.device)
    try:
        yield runtime
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _gather(obj: Any, world: int) -> list[Any]:
    """Every rank's `obj`, in rank order (also a barrier); `[obj]` in one process."""
    if world <= 1:
        return [obj]
    import torch.distributed as dist

    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, obj)
    return parts


def check_bucket_memory(profile: RunProfile) -> None:
    """Refuse buckets whose clip cannot fit this machine, before any is decoded: a clip is held at its
    bucket's size as uint8 frames and again as the tokenizer's fp32 input, `tokenizer.prefetch` clips
    ahead (`data.buckets=[[8192,8192]]` upscaled 96x128 sources past 5 GB)."""
    cfg = profile.data
    h, w = max(cfg.buckets, key=lambda b: b[0] * b[1])
    frames = max(cfg.frame_buckets)
    clip = frames * h * w * 3
    require(
        clip * 4 + clip * max(1, profile.tokenizer.prefetch),
        host_memory_bytes(),
        f"data.buckets: a clip of {frames} frames (data.frame_buckets) at {h}x{w}",
        "lower data.buckets (or data.frame_buckets, tokenizer.prefetch)",
    )


def run(
    profile: RunProfile,
    shards_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    tokenizer: VideoTokenizer | None = None,
    on_shard: Callable[[dict[str, Any], int], None] | None = None,
    on_sample: Callable[[int, int], None] | None = None,
) -> TokenizeSummary:
    """Tokenize every shard of `shards_dir` (this rank's share under torchrun) into `out`. Either may be
    an fsspec URL: input shards are read through the local cache; output is written in a local staging
    folder and uploaded, each rank its shards, then rank 0 the index. `on_shard(entry, shards)` after each
    shard; `on_sample(done, total)` as this rank's samples are encoded (total: its shards' samples, from
    the index, so a bar has its end from the start)."""
    target = out
    index = read_index(shards_dir, StoreSettings.from_profile(profile.data))
    if index.kind != "media":
        raise UserInputError(
            f"{shards_dir}: holds {index.kind} shards; pass the output directory of `vidforge shard`"
        )
    check_bucket_memory(profile)
    out, remote = staged(out, profile.data)
    if not is_url(shards_dir) and out.resolve() == Path(shards_dir).resolve():
        raise UserInputError(f"-o {out}: must differ from the input directory")
    with runtime_scope(profile) as runtime:
        # The folder's lock first (rank 0, for all ranks; held while `owner` lives, to the end of the run):
        # a busy folder is refused before the tokenizer loads.
        owner = UnitLedger(out)
        if runtime.rank == 0:
            owner.recover()
        if remote is not None and runtime.rank == 0:
            remote.remove(INDEX)  # readers see no dataset until the new one is whole
        if tokenizer is None:
            tokenizer = build_tokenizer(profile, str(runtime.device))
        summary = _tokenize_share(
            profile, index, shards_dir, out, tokenizer, (on_shard, on_sample), runtime.rank, runtime.world
        )
        if remote is not None:
            shards = sorted(index.shards, key=lambda s: s.name)[runtime.rank :: runtime.world]
            upload(out, remote, [s.name for s in shards], finish=False)
            _barrier(runtime.world)
            if runtime.rank == 0:
                upload(out, remote, [], finish=True)
            summary.out = str(target)
        return summary


def _tokenize_share(
    profile: RunProfile,
    index: ShardIndex,
    shards_dir: str | os.PathLike,
    out: Path,
    tokenizer: VideoTokenizer,
    progress: tuple[Callable[[dict[str, Any], int], None] | None, Callable[[int, int], None] | None],
    rank: int,
    world: int,
) -> TokenizeSummary:
    """This rank's shards (rank::world) into `out`; rank 0 writes the index once every rank is done.
    `progress`: `run`'s on_shard and on_sample."""
    on_shard, on_sample = progress
    ledger = UnitLedger(out)  # `run` holds the folder's lock
    started = time.perf_counter()
    _barrier(world)
    done = {e["unit"]: e["data"] for e in ledger.entries() if e["kind"] == "record"}
    shards = sorted(index.shards, key=lambda s: s.name)
    summary = TokenizeSummary(shards=len(shards), out=str(out))
    workers = max(1, min(8, profile.tokenizer.prefetch))
    mine = shards[rank::world]
    total, moved = sum(e.samples for e in mine), [0]

    def advance(n: int) -> None:
        moved[0] += n
        if on_sample is not None:
            on_sample(moved[0], total)

    with ThreadPoolExecutor(workers, thread_name_prefix="vf-decode") as pool:
        for entry in mine:
            unit = f"{entry.name}#{entry.sha256}"
            try:  # the name comes from the input's index: it may only name a file inside each folder
                path = inside(out, plain_name(entry.name, "shard name"), "shard name")
                in_path = index.path(entry)  # a remote one: fetched and checked (ShardError if corrupt)
            except (UnsafePath, ShardError) as err:
                summary.errors.append({"shard": entry.name, "reason": str(err)})
                continue
            result = done.get(unit)
            if result is not None and path.is_file() and path.stat().st_size == result["bytes"]:
                summary.skipped += 1
                advance(entry.samples)
            else:
                try:
                    result, errors, encode_s = tokenize_shard(
                        in_path, entry, path, tokenizer, profile, pool, advance
                    )
                except ShardError as err:
                    summary.errors.append({"shard": entry.name, "reason": str(err)})
                    continue
                summary.encode_seconds += encode_s
                ledger.commit(unit, [result], errors)
                summary.written += 1
            summary.samples += result["samples"]
            if on_shard is not None:
                on_shard(result, len(shards))
    # Shards that could not be read are not committed (a rerun retries them), so they are not in the ledger:
    # gather them from every rank (this is also the barrier before the index), in shard order as in one process.
    unread = sorted((e for part in _gather(summary.errors, world) for e in part), key=lambda e: e["shard"])
    units = {f"{s.name}#{s.sha256}" for s in shards}
    entries = [e for e in ledger.entries() if e["unit"] in units]
    summary.errors = unread + [e["data"] for e in entries if e["kind"] == "error"]
    summary.rejected = len(summary.errors)
    summary.seconds = time.perf_counter() - started
    if rank == 0:
        records = [e["data"] for e in entries if e["kind"] == "record"]
        from vidforge.data.manifest import write_jsonl

        write_jsonl(out / "manifest.jsonl", sorted(records, key=lambda r: r["name"]))
        write_jsonl(out / "errors.jsonl", summary.errors)
        write_index(
            out,
            "latent",
            records,
            created_by="vidforge tokenize",
            tokenizer=tokenizer.describe(),
            text_encoder=index.meta.get("text_encoder"),
            source=str(shards_dir),
        )
        write_nv_meta(read_index(out))  # Energon's metadata, where it is installed
    return summary


def decode(tokenizer: VideoTokenizer, latent: np.ndarray | torch.Tensor) -> np.ndarray:
    """A latent (C, T, H, W) back to uint8 frames (F, H, W, 3): the inverse of tokenize, used by `infer`."""
    z = torch.as_tensor(np.asarray(latent) if not isinstance(latent, torch.Tensor) else latent)[None]
    return tensor_to_frames(tokenizer.decode(z.float())[0])
