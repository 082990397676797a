"""Export for `infer`: one safetensors model (the EMA weights when there is an EMA) with its config, and
the profile the run trained with (so infer builds the same tokenizer and text encoder)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vidforge.models import build_model, save_model
from vidforge.profile import RunProfile, dump_profile
from vidforge.train.ema import EMA

# Wrappers that activation checkpointing and torch.compile put into parameter names.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _full(t: torch.Tensor) -> torch.Tensor:
    # An FSDP shard (DTensor) is gathered; every rank must call this for every tensor, in the same order.
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def export_weights(
    profile: RunProfile, model: nn.Module, ema: EMA | None, out: str | Path, rank: int = 0
) -> Path:
    source = ema.state_dict() if ema is not None else {n: p for n, p in model.named_parameters()}
    weights = {clean_name(name): _full(t.detach()).float().cpu() for name, t in source.items()}
    # Buffers and frozen tensors are not in the EMA: take them from the trained model (on every rank,
    # in one order, since gathering a shard is collective).
    for name, t in model.state_dict().items():
        if clean_name(name) not in weights:
            weights[clean_name(name)] = _full(t.detach()).cpu()
    out = Path(out)
    if rank == 0:
        plain = build_model(profile.model, device="cpu")
        plain.load_state_dict(weights, strict=True)
        save_model(plain, out)
        (out / "profile.yaml").write_text(dump_profile(profile))
    return out
