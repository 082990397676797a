"""Exponential moving average of the weights, kept in fp32, updated in place after each optimizer step.

Works on plain tensors and on FSDP's sharded DTensors alike: each rank averages its own shard, so the
EMA costs one extra copy of the local parameters and no communication."""

from __future__ import annotations

import torch
from torch import nn


class EMA:
    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        self.shadow = [params[n].detach().to(torch.float32, copy=True) for n in self.names]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        current = [params[n].detach().to(torch.float32) for n in self.names]
        torch._foreach_lerp_(self.shadow, current, 1.0 - self.decay)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Load the averaged weights into `model` (a model of the same structure and sharding)."""
        params = dict(model.named_parameters())
        for name, value in zip(self.names, self.shadow, strict=True):
            params[name].copy_(value)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.shadow, strict=True))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.names) - set(state)
        if missing:
            raise KeyError(f"EMA state lacks {sorted(missing)[:3]}...")
        for i, name in enumerate(self.names):
            self.shadow[i].copy_(state[name])
