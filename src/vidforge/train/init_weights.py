"""`vidforge train --init SRC`: start training from published or earlier weights (a new optimizer, step 0).

SRC is a vidforge export (`RUN/export`: model.safetensors), a diffusers transformer folder (Wan2.1's
`WanTransformer3DModel`: its tensor names are the wan family's own), or a whole diffusers pipeline folder
(its transformer/). Tensors are matched by name: each is loaded (same name and shape), new (the model has
it, SRC does not), reshaped (both have it, shapes differ) or unused (SRC has it, the model does not).
NeMo's "partial weight initialization" for a grown or changed model: anything but a full match is refused
unless `--allow-partial` says so, and the report says which tensors went which way. The weights are read
one tensor at a time into the built model, before any parallelism is applied (so every layout starts
from the same weights)."""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from vidforge.errors import UserInputError
from vidforge.models.checkpoint import CONFIG, WEIGHTS
from vidforge.models.wan_weights import INDEX, SINGLE, StoredTensor, stored_tensors, transformer_folder


@dataclass(frozen=True)
class WeightsInit:
    """Where training starts from (`--init`), and whether a partial match is accepted (`--allow-partial`)."""

    src: Path
    allow_partial: bool = False


@dataclass
class InitReport:
    source: str
    flag: str = "--init"  # what the report names the source with (`tokenize finetune` reports its VAE)
    loaded: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    reshaped: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.new or self.reshaped or self.unused)

    def describe(self) -> str:
        parts = [f"{len(self.loaded)} tensors loaded"]
        for what, names in (
            ("new", self.new),
            ("of another shape, new", self.reshaped),
            ("unused", self.unused),
        ):
            if names:
                parts.append(f"{len(names)} {what} ({_some(names)})")
        return f"{self.flag} {self.source}: " + ", ".join(parts)

    def as_dict(self) -> dict[str, int]:
        return {k: len(getattr(self, k)) for k in ("loaded", "new", "reshaped", "unused")}


def _some(names: list[str], count: int = 3) -> str:
    return ", ".join(names[:count]) + (", ..." if len(names) > count else "")


def source_tensors(src: str | os.PathLike) -> dict[str, StoredTensor]:
    """Every tensor SRC holds, by name, from the safetensors headers alone."""
    path = Path(src)
    if (path / WEIGHTS).is_file():  # a vidforge export
        return stored_tensors(path, WEIGHTS, WEIGHTS + ".index.json")
    folder = transformer_folder(path)
    if not (folder / CONFIG).is_file():
        raise UserInputError(
            f"--init {src}: neither a vidforge export ({WEIGHTS}) nor a diffusers transformer or pipeline "
            "folder; point at RUN/export or the downloaded model folder"
        )
    return stored_tensors(folder, SINGLE, INDEX)


@torch.no_grad()
def init_from(model: nn.Module, src: str | os.PathLike, allow_partial: bool = False) -> InitReport:
    """Copy SRC's tensors into `model` by name (cast to each parameter's dtype); refuse anything but a full
    match unless `allow_partial`. Returns what was loaded and what was not."""
    stored = source_tensors(src)
    own = model.state_dict()
    report = InitReport(str(src))
    for name, tensor in own.items():
        if name not in stored:
            report.new.append(name)
        elif stored[name].shape != tuple(tensor.shape):
            report.reshaped.append(name)
        else:
            report.loaded.append(name)
    report.unused = sorted(set(stored) - set(own))
    if not report.loaded:
        raise UserInputError(
            f"--init {src}: none of its {len(stored)} tensors is one of the model's (e.g. {_some(sorted(stored))}); "
            "is it weights of this model family (model.family, model.preset)?"
        )
    if not report.complete and not allow_partial:
        raise UserInputError(f"{report.describe()}; pass --allow-partial to start the rest fresh")
    with ExitStack() as files:
        handles = {}
        for name in report.loaded:
            t = stored[name]
            if t.file not in handles:
                handles[t.file] = files.enter_context(safe_open(str(t.file), framework="pt"))
            own[name].copy_(handles[t.file].get_tensor(name))
    return report
