"""`data`: settings of `vidforge shard` and the training loader (shard size, split, buckets, packing, blending)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.section import Section

VIDEO_EXTENSIONS = ("mp4", "mov", "mkv", "webm", "avi", "m4v", "mpg", "mpeg", "ts")
"""File types read as videos, everywhere: curation's inputs (`curation.extensions`' default, with a dot),
shard members (the loader, the VAE fine-tune). Images are `data.image_extensions`."""


class Source(Section):
    """One shard directory the loader reads, with its blending weight."""

    path: str
    """A shard directory holding `index.json` (the output of `vidforge shard` or `vidforge tokenize`)."""
    weight: float = Field(1.0, gt=0)
    """Relative sampling weight: a source of weight 2 is drawn twice as often as one of weight 1."""
    split: str = "train"
    """Which split's shards to read (`train` or `val`)."""


class Data(Section):
    """Settings of `vidforge shard` and the training loader (shard size, split, buckets, packing, blending)."""

    shard_max_samples: int = Field(1000, ge=1)
    """A shard is closed when it holds this many samples."""
    shard_max_bytes: int = Field(1 << 30, ge=1)
    """... or when adding the next sample would take it past this many bytes (a lone larger sample still
    gets its own shard). 1 GiB keeps a shard a few seconds of reading at object-store speeds."""
    val_fraction: float = Field(0.01, ge=0, lt=1)
    """Share of samples put in the validation split, chosen by a hash of the sample key and `split_seed`
    (so a sample's split never changes between reruns or when more data is added)."""
    split_seed: str = "vidforge"
    """Salt of the train/validation hash; change it to draw a different validation set."""
    group_by_bucket: bool = False
    """Write separate shards per (resolution, aspect, length) bucket, so a shard holds one shape after
    tokenizing (useful for the bucketed, unpacked loader mode)."""
    buckets: list[tuple[int, int]] = [(256, 256), (192, 320), (320, 192), (128, 128)]
    """Resolution buckets as (height, width) in pixels, multiples of the tokenizer's spatial compression
    times the model patch. A clip goes to the bucket nearest its aspect ratio (then the largest that fits),
    and `tokenize` resizes and centre-crops it there."""
    frame_buckets: list[int] = [1, 17, 33]
    """Frame counts of the length buckets; each of the form 4k+1 for the causal VAEs (1 = an image). A clip
    uses the longest bucket it fills; frames beyond it are dropped."""
    image_extensions: list[str] = ["jpg", "jpeg", "png", "webp"]
    """File types read as images (a sample of one frame)."""

    # --- the training loader ---
    sources: list[Source] = []
    """Shard directories to blend (each with a weight). Empty: the command's argument is the only source."""
    seed: int = 0
    """Seed of shard order, shuffle buffer and blending. The stream is a function of (seed, rank, epoch)."""
    shuffle_buffer: int = Field(256, ge=1)
    """Samples held for shuffling (1 = no shuffle within the read order)."""
    packing: bool = True
    """Pack variable-length samples into micro-batches up to `token_budget` tokens (first-fit-decreasing).
    false: bucketed mode, `batch_size` samples of one latent shape per batch."""
    token_budget: int = Field(4096, ge=1)
    """Tokens per packed micro-batch (after the model's patchify); a sample longer than this is skipped."""
    pack_buffer: int = Field(64, ge=1)
    """Samples the packer looks at together; a larger buffer packs tighter."""
    batch_size: int = Field(1, ge=1)
    """Samples per micro-batch in the bucketed (unpacked) mode."""
    epochs: int | None = None
    """Passes over the data; null repeats forever (training stops by step count)."""
    prefetch: int = Field(2, ge=0)
    """Batches read, decoded and packed ahead of the training step by a background thread, so the step
    does not wait for data; 0 loads them inside the step. A model-parallel group's sample exchange
    (`mp_read` broadcast/allgather) runs in that thread too, on a gloo group of its own."""
    cache_dir: str = "~/.cache/vidforge"
    """Local folder for shards read from object storage (`--data s3://bucket/prefix`, any fsspec URL) and
    for datasets staged before `shard`/`tokenize` upload them; on a cluster, the node's NVMe."""
    cache_bytes: int = Field(100 << 30, ge=1)
    """Most bytes of remote shards kept in `cache_dir`; the least recently used go first."""
    storage_options: dict[str, str | int | float | bool | dict] = {}
    """fsspec options of the object store, e.g. {endpoint_url: http://127.0.0.1:9000} for an S3-compatible
    server; credentials are best left to the store's usual environment variables or profiles."""
    io_retries: int = Field(4, ge=1)
    """Attempts at each object-store call that fails transiently (connection, timeout), with backoff
    0.5 s, 1 s, 2 s, ... between them."""
    on_error: Literal["skip", "fail"] = "skip"
    """A truncated or corrupt shard or an undecodable sample: `skip` logs it and goes on, `fail` stops."""
    verify: Literal["sha256", "count", "none"] = "sha256"
    """Check each shard before yielding any of its samples: `sha256` hashes the file against the index
    (one extra sequential read), `count` only checks the tar's sample count, `none` trusts it."""
    mp_read: Literal["broadcast", "allgather", "each"] = "allgather"
    """How the ranks of one model-parallel group (tp x cp x pp) get identical samples: `broadcast` (group
    rank 0 reads, sends), `allgather` (each reads a share, all exchange; NeMo), `each` (all read all)."""

    @model_validator(mode="after")
    def _check(self) -> Data:
        for n in self.frame_buckets:
            if n < 1 or (n - 1) % 4:
                raise ValueError(f"frame_buckets: each must be 4k+1 (1, 5, 9, 17, 33, ...), got {n}")
        for h, w in self.buckets:
            if h < 8 or w < 8 or h % 8 or w % 8:
                raise ValueError(f"buckets: (height, width) must be multiples of 8, got ({h}, {w})")
        if not self.buckets or not self.frame_buckets:
            raise ValueError("buckets: give at least one resolution and one frame bucket")
        return self
