"""Micro-batches for the DiT: sequence packing up to a token budget, or shape buckets without packing.

Packing: variable-length latents (videos of different lengths and sizes, images) are packed into rows
of at most `token_budget` tokens by first-fit-decreasing over a buffer of samples; the fullest bin is
emitted, so the buffer keeps the small samples that fill the next gaps. Each sample's tokens stay
contiguous, in the order and layout of `vidforge.tokens.layout` (a `SequenceLayout` of per-sample
token grids, giving cu_seqlens, the sample of each token and 3D RoPE positions).

Both batchers are resumable: their state is the loader's plus the references of the samples they hold."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vidforge.data.loader import ShardLoader
from vidforge.data.token_budget import sample_tokens
from vidforge.errors import UserInputError
from vidforge.memory import host_memory_bytes, require
from vidforge.profile import RunProfile
from vidforge.tokens import SequenceLayout, pack_latents

log = logging.getLogger("vidforge.data")

CONDITION = "condition.npy"
"""Image-to-video: a sample's condition latents (C', T, H, W) float32, laid out as its `latent.npy`
(`vidforge.tokenizers.image_condition`; the network reads them beside the noisy latents)."""
IMAGE_EMB = "image_emb.npy"
"""Image-to-video: the embedding of a sample's first frame (L, D) float16 (its CLIP states)."""


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Bins (lists of indices into `lengths`) of total length <= budget: items in decreasing length (ties
    by index), each into the first bin with room. Items longer than the budget are left out."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        if n > budget:
            continue
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return bins


@dataclass
class PackedBatch:
    """One packed micro-batch: a row of tokens and what the model needs to keep the samples apart."""

    tokens: torch.Tensor  # (1, S, pt*ph*pw*C), samples back to back in `layout` order
    layout: SequenceLayout  # per-sample token grids -> cu_seqlens, sample_index, positions
    text_emb: torch.Tensor  # (B, L, D) float32
    text_mask: torch.Tensor  # (B, L) bool
    keys: list[str]
    latent_shapes: list[tuple[int, ...]]
    budget: int
    meta: list[dict]
    condition: torch.Tensor | None = None  # (1, S, pt*ph*pw*C') image-to-video, tokens as `tokens`
    image_emb: torch.Tensor | None = None  # (B, L, D) float32 image-to-video

    @property
    def used(self) -> int:
        return self.layout.total

    @property
    def efficiency(self) -> float:
        return self.used / self.budget

    def cu_seqlens(self) -> torch.Tensor:
        return self.layout.cu_seqlens()

    def positions(self) -> torch.Tensor:
        return self.layout.positions()


@dataclass
class BucketBatch:
    """One unpacked micro-batch: samples of one latent shape stacked."""

    latents: torch.Tensor  # (B, C, T, H, W)
    text_emb: torch.Tensor
    text_mask: torch.Tensor
    keys: list[str]
    meta: list[dict]
    condition: torch.Tensor | None = None  # (B, C', T, H, W) image-to-video
    image_emb: torch.Tensor | None = None  # (B, L, D) float32 image-to-video


def _text(samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    emb = torch.from_numpy(np.stack([s["text_emb.npy"] for s in samples]).astype(np.float32))
    mask = torch.from_numpy(np.stack([s["text_mask.npy"] for s in samples]).astype(bool))
    return emb, mask


def _image_inputs(samples: list[dict]) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
    """The samples' condition latents and image embeddings, each None unless every sample has one."""
    condition = None
    if all(CONDITION in s for s in samples):
        condition = [torch.from_numpy(np.asarray(s[CONDITION], dtype=np.float32)) for s in samples]
    image = None
    if all(IMAGE_EMB in s for s in samples):
        image = torch.from_numpy(np.stack([s[IMAGE_EMB] for s in samples]).astype(np.float32))
    return condition, image


class _Batcher:
    def __init__(self, loader: Any):
        self.loader = loader
        self.buffer: list[dict] = []
        self._ended = False

    def _pull(self) -> bool:
        sample = self.loader.next_sample()
        if sample is None:
            self._ended = True
            return False
        self.buffer.append(sample)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {
            "loader": self.loader.state_dict(),
            "buffer": [[*s["__ref__"], s.get("__waited__", 0)] for s in self.buffer],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])
        self.buffer = []
        for *ref, waited in state["buffer"]:
            sample = self.loader.fetch(tuple(ref))
            if sample is not None:
                sample["__waited__"] = waited
                self.buffer.append(sample)
        self._ended = False

    def __iter__(self):
        while (batch := self.next_batch()) is not None:
            yield batch


class Packer(_Batcher):
    """Packed micro-batches from a loader of latent samples (`latent.npy` (C, T, H, W) each)."""

    def __init__(self, loader: Any, patch: Sequence[int], token_budget: int, buffer: int = 64):
        super().__init__(loader)
        self.patch, self.budget, self.buffer_size = tuple(patch), token_budget, buffer
        self.stats = {"batches": 0, "tokens": 0, "capacity": 0, "skipped_too_long": 0}
        self._skipped_in_row = 0
        # A whole pass of the data (every rank's samples: an upper bound on this rank's share) skipped in a
        # row: no sample fits, and a loader repeating its epochs would skip them forever.
        self._max_skips = max(1, getattr(loader, "epoch_samples", 0) or 1_000_000)
        self._named: set[str] = set()

    def _skip(self, sample: dict) -> None:
        tokens = self._length(sample)
        self.stats["skipped_too_long"] += 1
        self._skipped_in_row += 1
        if sample["__key__"] not in self._named and len(self._named) < 100:  # each once, not each epoch
            self._named.add(sample["__key__"])
            log.warning(
                "skipping %s: %d tokens exceed data.token_budget=%d", sample["__key__"], tokens, self.budget
            )
        if self._skipped_in_row >= self._max_skips:
            raise UserInputError(
                f"data.token_budget={self.budget}: no sample of the data fits ({self._skipped_in_row} skipped "
                f"in a row, e.g. {sample['__key__']} of {tokens} tokens); --set data.token_budget={tokens} "
                "or more"
            )

    @property
    def efficiency(self) -> float:
        """Tokens used over tokens offered, over every batch so far (1 - padding waste)."""
        return self.stats["tokens"] / self.stats["capacity"] if self.stats["capacity"] else 0.0

    def _length(self, sample: dict) -> int:
        return sample_tokens(sample["latent.npy"].shape, self.patch)

    def next_batch(self) -> PackedBatch | None:
        while len(self.buffer) < self.buffer_size and not self._ended:
            if self._pull() and self._length(self.buffer[-1]) > self.budget:
                self._skip(self.buffer.pop())
            elif self.buffer:
                self._skipped_in_row = 0
        if not self.buffer:
            return None
        lengths = [self._length(s) for s in self.buffer]
        bins = first_fit_decreasing(lengths, self.budget)
        fills = [sum(lengths[i] for i in b) for b in bins]
        if self._ended:
            chosen = bins[0]
        else:  # the fullest bin, unless the oldest sample has waited a whole buffer's worth: then its bin
            chosen = bins[max(range(len(bins)), key=lambda b: (fills[b], -b))]
            oldest = next(b for b in bins if 0 in b)
            if self.buffer[0].get("__waited__", 0) >= self.buffer_size:
                chosen = oldest
        chosen_set = set(chosen)
        picked = [self.buffer[i] for i in sorted(chosen)]  # arrival order within the row
        self.buffer = [s for i, s in enumerate(self.buffer) if i not in chosen_set]
        for s in self.buffer:
            s["__waited__"] = s.get("__waited__", 0) + 1
        latents = [torch.from_numpy(np.asarray(s["latent.npy"], dtype=np.float32)) for s in picked]
        tokens, layout = pack_latents(latents, self.patch)
        emb, mask = _text(picked)
        conditions, image = _image_inputs(picked)
        condition = pack_latents(conditions, self.patch)[0] if conditions is not None else None
        self.stats["batches"] += 1
        self.stats["tokens"] += layout.total
        self.stats["capacity"] += self.budget
        return PackedBatch(
            tokens,
            layout,
            emb,
            mask,
            [s["__key__"] for s in picked],
            [tuple(x.shape) for x in latents],
            self.budget,
            [s.get("json", {}) for s in picked],
            condition,
            image,
        )


class Bucketer(_Batcher):
    """Unpacked micro-batches of `batch_size` samples with the same latent shape (shape buckets)."""

    def __init__(self, loader: Any, batch_size: int):
        super().__init__(loader)
        self.batch_size = batch_size

    def next_batch(self) -> BucketBatch | None:
        while True:
            by_shape: dict[tuple, list[int]] = {}
            for i, s in enumerate(self.buffer):
                by_shape.setdefault(tuple(s["latent.npy"].shape), []).append(i)
            full = [ix for ix in by_shape.values() if len(ix) >= self.batch_size]
            if full or (self._ended and self.buffer):
                chosen = (min(full, key=lambda ix: ix[0]) if full else next(iter(by_shape.values())))[
                    : self.batch_size
                ]
                picked = [self.buffer[i] for i in chosen]
                self.buffer = [s for i, s in enumerate(self.buffer) if i not in set(chosen)]
                latents = torch.from_numpy(np.stack([s["latent.npy"] for s in picked]).astype(np.float32))
                emb, mask = _text(picked)
                conditions, image = _image_inputs(picked)
                return BucketBatch(
                    latents,
                    emb,
                    mask,
                    [s["__key__"] for s in picked],
                    [s.get("json", {}) for s in picked],
                    torch.stack(conditions) if conditions is not None else None,
                    image,
                )
            if self._ended:
                return None
            self._pull()


def build_batcher(profile: RunProfile, loader: ShardLoader) -> Packer | Bucketer:
    """The profile's micro-batcher: packed (`data.packing`) or bucketed."""
    cfg = profile.data
    if cfg.packing:
        # The buffer holds decoded samples, refilled from a loader that may repeat epochs without end:
        # data.pack_buffer=1000000000 filled 3 GB before the first step.
        sample = getattr(loader, "mean_sample_bytes", 0.0)
        require(
            cfg.pack_buffer * sample,
            host_memory_bytes(),
            f"data.pack_buffer={cfg.pack_buffer} (samples of {sample:,.0f} bytes on average, by the data's "
            "index)",
            "lower data.pack_buffer (64 packs well)",
        )
        return Packer(loader, profile.model.patch, cfg.token_budget, cfg.pack_buffer)
    return Bucketer(loader, cfg.batch_size)
