"""What a training step actually holds, measured from the tensors themselves (CPU has no
`max_memory_allocated`): the local shards of parameters, gradients, optimizer and EMA states, and the
bytes autograd saves for the backward during a forward.

Saved activations are collected with `torch.autograd.graph.saved_tensors_hooks`, deduplicated by storage
(views and tensors saved by several ops count once), without the parameters' own storage, and sized
when the forward has finished: FSDP2 frees the unsharded weights it gathered by resizing their storage
to zero after a block's forward, so only the copies that really stay (the last block's) still count.
An activation-checkpointed block (non-reentrant) saves its inputs through the same hooks, from outside
its own checkpoint hooks, so they are counted; what an offloaded block saves goes through
the offloader's hooks (memory_savers/activation_offload.py), nested inside these, and is not (it waits in host memory)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that own memory behind `t`: itself, or the inner tensors of a wrapper subclass
    (DTensor's local shard, the result of a functional collective, ...), which have no storage of
    their own."""
    if type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter) and type(t.data) is torch.Tensor:
        return [t]
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        inner = [getattr(t, name) for name in names]
        return [p for x in inner if isinstance(x, torch.Tensor) for p in _plain_tensors(x)]
    return [t]


@dataclass
class SavedActivations:
    """Filled by `saved_activations`: the storages autograd saved, read after the forward."""

    excluded: set[int] = field(default_factory=set)
    storages: dict[int, torch.UntypedStorage] = field(default_factory=dict)

    def add(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        for plain in _plain_tensors(t):
            key = _storage_key(plain)
            if key and key not in self.excluded and key not in self.storages:
                self.storages[key] = plain.untyped_storage()

    @property
    def bytes(self) -> int:
        return sum(s.nbytes() for s in self.storages.values())


@contextmanager
def saved_activations(model: nn.Module) -> Iterator[SavedActivations]:
    """Record what autograd saves while the block runs (the forward of a training step)."""
    found = SavedActivations(
        excluded={_storage_key(q) for p in model.parameters() for q in _plain_tensors(p)}
    )

    def pack(t: torch.Tensor) -> torch.Tensor:
        found.add(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield found


def _tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def state_bytes(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None, ema: object | None = None
) -> dict[str, int]:
    """Bytes of this rank's parameters (with the float8 base's scales, which are part of its weights
    though buffers), gradients, optimizer states and EMA shadow (local shards)."""
    params = list(model.parameters())
    scales = [b for name, b in model.named_buffers() if name.endswith(".weight_scale")]
    out = {
        "parameters": _tensor_bytes([*params, *scales]),
        "gradients": _tensor_bytes(p.grad for p in params if p.grad is not None),
    }
    if optimizer is not None:
        states = [
            v
            for s in optimizer.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor) and v.ndim > 0
        ]
        out["optimizer"] = _tensor_bytes(states)
    if ema is not None:
        out["ema"] = _tensor_bytes(ema.state_dict().values())  # type: ignore[attr-defined]
    return out
