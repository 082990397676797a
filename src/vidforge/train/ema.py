"""Exponential moving average of the weights, kept in fp32, updated in place after each optimizer step.

Works on plain tensors and on FSDP's sharded DTensors alike: each rank averages its own shard, so the
EMA costs one extra copy of the local parameters and no communication.

Under pipeline parallel a rank holds several modules (its stage modules), each with its own shadow.
Their parameter names are the whole model's, and the conditioning parameters every stage holds appear
under the same name in several modules with equal values: `state_dict` merges the shadows by name
(keeping one copy), `load_state_dict` gives each module's shadow its own names."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

Modules = nn.Module | Sequence[nn.Module]


def as_module_list(modules: Modules) -> list[nn.Module]:
    """One module or a sequence of them (pipeline stage modules), as a list."""
    return [modules] if isinstance(modules, nn.Module) else list(modules)


def tensor_kind(t: torch.Tensor) -> tuple:
    """What a fused or foreach op over a list of tensors needs them to share: a plain tensor, or a DTensor
    of one mesh and placement (tensor parallel leaves some parameters replicated plain tensors, and with
    FSDP2 they sit on other meshes than the sharded ones), on one device (FSDP2 keeps the shards of block
    swap's blocks, or under train.fsdp_cpu_offload every shard, in host memory)."""
    mesh = getattr(t, "device_mesh", None)
    return type(t), id(mesh) if mesh is not None else None, tuple(getattr(t, "placements", ())), t.device.type


class _Shadow:
    """The average of one module's trainable parameters."""

    def __init__(self, module: nn.Module):
        self.names = [name for name, p in module.named_parameters() if p.requires_grad]
        params = dict(module.named_parameters())
        self.values = [params[n].detach().to(torch.float32, copy=True) for n in self.names]

    def current(self, module: nn.Module) -> list[torch.Tensor]:
        params = dict(module.named_parameters())
        return [params[n] for n in self.names]


class EMA:
    def __init__(self, modules: Modules, decay: float):
        self.decay = decay
        self._shadows = [_Shadow(m) for m in as_module_list(modules)]

    @property
    def names(self) -> list[str]:
        """Every averaged parameter name, once (the order of first appearance)."""
        return list(dict.fromkeys(n for s in self._shadows for n in s.names))

    def _pairs(self, modules: Modules) -> list[tuple[_Shadow, nn.Module]]:
        modules = as_module_list(modules)
        if len(modules) != len(self._shadows):
            raise ValueError(f"the EMA averages {len(self._shadows)} module(s), got {len(modules)}")
        return list(zip(self._shadows, modules, strict=True))

    @torch.no_grad()
    def update(self, modules: Modules) -> None:
        for shadow, module in self._pairs(modules):
            current = [p.detach().to(torch.float32) for p in shadow.current(module)]
            # One fused lerp per kind of tensor: a foreach op cannot mix DTensors of different meshes
            # (tensor-parallel blocks) with the plain tensors tensor parallel leaves replicated.
            groups: dict[object, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
            for value, now in zip(shadow.values, current, strict=True):
                key = tensor_kind(value)
                groups.setdefault(key, ([], []))
                groups[key][0].append(value)
                groups[key][1].append(now)
            for values, nows in groups.values():
                torch._foreach_lerp_(values, nows, 1.0 - self.decay)

    @torch.no_grad()
    def copy_to(self, modules: Modules) -> None:
        """Load the averaged weights into `modules` (modules of the same structure and sharding)."""
        for shadow, module in self._pairs(modules):
            for param, value in zip(shadow.current(module), shadow.values, strict=True):
                param.copy_(value)

    def state_dict(self) -> dict[str, torch.Tensor]:
        merged: dict[str, torch.Tensor] = {}
        for shadow in self._shadows:
            for name, value in zip(shadow.names, shadow.values, strict=True):
                merged.setdefault(name, value)
        return merged

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.names) - set(state)
        if missing:
            raise KeyError(f"EMA state lacks {sorted(missing)[:3]}...")
        for shadow in self._shadows:
            for value, name in zip(shadow.values, shadow.names, strict=True):
                value.copy_(state[name])
