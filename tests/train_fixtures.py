"""Latent shards for training tests, made by the real `shard` and `tokenize` stages from a synthetic
annotated directory (pixel tokenizer, random open-clip text tower: no weights needed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from vidforge.data.manifest import stable_id, write_jsonl
from vidforge.data.sharding import run as shard_run
from vidforge.data.testing import make_annotated_dir
from vidforge.profile import RunProfile, load_profile
from vidforge.tokenizers.tokenize import run as tokenize_run

# The default profile's model and tokenizer (pixel 4x4x4 -> 192 channels) on 16x24 clips of 9 frames:
# latents (192, 3, 4, 6) -> 72 tokens with patch 1x1x1; a narrower, shallower DiT to keep tests fast.
LATENT_SHAPE = (192, 3, 4, 6)
TRAIN_SETS = (
    "model.hidden=64",
    "model.mlp_hidden=256",
    "data.buckets=[[16,24]]",
    "data.frame_buckets=[9]",
    "data.val_fraction=0",
    "data.token_budget=144",
    "data.shuffle_buffer=4",
    "train.precision=fp32",
    "train.warmup_steps=1",
    "train.log_every=1",
    "train.save_every=3",
    "train.steps=6",
    "train.lr=1e-3",
    "train.validate_every=0",  # fine-tunes validate by default; the tests that want it say so
    "diffusion.steps=4",
    "infer.frames=9",
    "infer.height=16",
    "infer.width=24",
)

# Wan2.1's transformer (tiny, as the profile above sizes it) with its objective, rectified flow.
WAN = (
    "model.family=wan",
    "model.mlp_act=gelu-tanh",
    "model.adaln_lora_rank=0",
    "model.abs_position=none",
    "model.cross_attn_norm=true",
    "diffusion.objective=flow",
)


def train_profile(*extra: str) -> RunProfile:
    return load_profile("local_cpu", [*TRAIN_SETS, *extra])


def make_latents(
    root: Path, *, identical: bool = False, samples: int = 4, images: int = 0, sets: tuple[str, ...] = ()
) -> Path:
    """Latent shards under root/latents. identical=True: every sample is the same clip and caption, one
    sample per shard, so data-parallel ranks see the same data as a single process does. `images`: that
    many still images besides the `samples` videos; `sets`: profile overrides for shard and tokenize
    (e.g. other data.frame_buckets, or ones that keep the images)."""
    annotated = make_annotated_dir(
        root / "annotated", videos=samples, images=images, rejected=0, size=(48, 64), frames=(9, 12), seed=0
    )
    sets = [*sets, "data.shard_max_samples=1"] if identical else list(sets)
    if identical:
        records = [json.loads(line) for line in (annotated / "manifest.jsonl").read_text().splitlines()]
        first = records[0]
        write_jsonl(
            annotated / "manifest.jsonl", [{**first, "clip_id": stable_id("copy", i)} for i in range(samples)]
        )
    profile = train_profile(*sets)
    shard_run(profile, annotated, root / "shards")
    tokenize_run(profile, root / "shards", root / "latents")
    return root / "latents"


def synthetic_latents(root: Path, shards: int = 1) -> Path:
    """Latent shards of random `LATENT_SHAPE` samples (two a shard, 8 x 32 captions) under root/latents,
    written directly (no shard or tokenize run): for tests that need data, not a data pipeline."""
    from vidforge.data.testing import make_latent_shards

    channels, *shape = LATENT_SHAPE
    return make_latent_shards(
        root / "latents",
        shards=shards,
        per_shard=2,
        channels=channels,
        shapes=(tuple(shape),),
        text_shape=(8, 32),
    )


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def probe_forward(model: torch.nn.Module, profile: RunProfile) -> torch.Tensor:
    """The model's output on fixed random latents of LATENT_SHAPE, noise levels and captions: two models
    with the same weights give the same tensor, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *LATENT_SHAPE, generator=g)
    text = torch.randn(2, 3, profile.model.text_dim, generator=g)
    with torch.no_grad():
        return model(x, torch.tensor([0.1, -0.5]), text)


@contextmanager
def killed_at_forward(monkeypatch: pytest.MonkeyPatch, call: int) -> Iterator[None]:
    """A run "killed" at its `call`-th forward (KeyboardInterrupt from inside the step, as a SIGKILL would
    stop it there): the body must be interrupted; the real step is back afterwards."""
    from vidforge.train.step import LocalTrainStep

    real = LocalTrainStep.forward
    calls = {"n": 0}

    def dies(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(LocalTrainStep, "forward", dies)
    with pytest.raises(KeyboardInterrupt):
        yield
    monkeypatch.setattr(LocalTrainStep, "forward", real)
