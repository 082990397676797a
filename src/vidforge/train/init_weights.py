"""`vidforge train --init SRC`: start training from published or earlier weights (a new optimizer, step 0).

SRC is a vidforge export (`RUN/export`: model.safetensors), a published folder of a registered family
(`vidforge.weights.weights_folder`: e.g. Wan2.1's diffusers transformer or whole pipeline download, whose
tensor names are the wan family's own; `vidforge train` then takes its profile from the folder), or a training checkpoint (`RUN/checkpoints/step_N`, or RUN itself: its latest complete
one). A checkpoint hands on its EMA weights where it has an EMA (what the run's export holds and infer
samples from, so `--init RUN` starts where `--init RUN/export` would), its raw weights with `raw`; it is
read with torch.distributed.checkpoint, so whatever layout wrote it (FSDP shards, TP, pipeline stages)
loads into the whole model; its optimizer state and step stay behind. Tensors are matched by name: each is loaded (same name and shape), new (the model has
it, SRC does not), reshaped (both have it, shapes differ) or unused (SRC has it, the model does not).
NeMo's "partial weight initialization" for a grown or changed model: anything but a full match is refused
unless `--allow-partial` says so, and the report says which tensors went which way. The weights are read
one tensor at a time into the built model, before any parallelism is applied (so every layout starts
from the same weights)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from vidforge.errors import UserInputError
from vidforge.train import safe_dcp
from vidforge.train.checkpoint import MARKER, latest_checkpoint
from vidforge.train.export import clean_name
from vidforge.weights.checkpoint import WEIGHTS
from vidforge.weights.experts import expert_export
from vidforge.weights.safetensors_stream import stored_tensors
from vidforge.weights.weights_folder import WeightsFolder, find_weights


@dataclass(frozen=True)
class WeightsInit:
    """Where training starts from (`--init`), and whether a partial match is accepted (`--allow-partial`)."""

    src: Path
    allow_partial: bool = False
    raw: bool = False
    """From a training checkpoint: its raw weights rather than their EMA."""


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


class _Safetensors:
    """An export or a published folder: tensors read one at a time from their safetensors files."""

    def __init__(self, found: WeightsFolder, expert: str | None = None):
        if found.export is not None:
            self.stored = stored_tensors(
                expert_export(found.export, expert), WEIGHTS, WEIGHTS + ".index.json"
            )
        else:
            published = found.published
            stored = stored_tensors(published.expert_weights(expert), published.single, published.index)
            self.stored = {name: t for name, t in stored.items() if not published.unread(name)}
        self.shapes = {name: t.shape for name, t in self.stored.items()}

    def read(self, into: Mapping[str, torch.Tensor]) -> None:
        with ExitStack() as files:
            handles = {}
            for name, target in into.items():
                file = self.stored[name].file
                if file not in handles:
                    handles[file] = files.enter_context(safe_open(str(file), framework="pt"))
                target.copy_(handles[file].get_tensor(name))


class _Checkpoint:
    """A training checkpoint's weights: the EMA's where it has one (unless `raw`), the model's for the
    rest (buffers, frozen tensors), as the export takes them. Names are cleaned of the wrappers that
    activation checkpointing and compile put into the EMA's names."""

    def __init__(self, path: Path, raw: bool):
        self.path = path
        metadata = safe_dcp.read_metadata(path / ".metadata").state_dict_metadata
        self.where: dict[str, tuple[str, str]] = {}  # clean name -> (group, name as saved)
        self.shapes: dict[str, tuple[int, ...]] = {}
        groups = ("model",) if raw else ("model", "ema")  # the EMA's entries win
        for group in groups:
            for key, meta in metadata.items():
                if key.startswith(group + ".") and hasattr(meta, "size"):
                    saved = key[len(group) + 1 :]
                    self.where[clean_name(saved)] = (group, saved)
                    self.shapes[clean_name(saved)] = tuple(meta.size)

    def read(self, into: Mapping[str, torch.Tensor]) -> None:
        state: dict[str, dict[str, torch.Tensor]] = {}
        for name, target in into.items():
            group, saved = self.where[name]
            state.setdefault(group, {})[saved] = target  # DCP reads into these tensors, casting
        safe_dcp.load(state, self.path)


def _checkpoint_dir(path: Path) -> Path | None:
    """A checkpoint folder, or a run directory's latest complete one; None for anything else."""
    if (path / MARKER).is_file() and (path / ".metadata").is_file():
        return path
    if (path / "checkpoints").is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise UserInputError(
                f"--init {path}: a run directory without a complete checkpoint; point at its export/ "
                "or at a run that saved one"
            )
        return latest
    return None


def open_source(
    src: str | os.PathLike, raw: bool = False, expert: str | None = None
) -> _Safetensors | _Checkpoint:
    """SRC's tensors by name and shape (from headers and metadata alone), and a way to read them; of a
    two-expert download or import, the `expert`'s."""
    path = Path(src)
    checkpoint = _checkpoint_dir(path)
    if checkpoint is not None:
        return _Checkpoint(checkpoint, raw)
    found = find_weights(path)
    if found is None:
        raise UserInputError(
            f"--init {src}: neither a vidforge export ({WEIGHTS}), a training checkpoint or run directory, "
            "nor a published model folder (a diffusers transformer or pipeline download); point at "
            "RUN/export, RUN or the downloaded model folder"
        )
    return _Safetensors(found, expert)


@torch.no_grad()
def init_from(
    model: nn.Module,
    src: str | os.PathLike,
    allow_partial: bool = False,
    raw: bool = False,
    expert: str | None = None,
) -> InitReport:
    """Copy SRC's tensors into `model` by name (cast to each parameter's dtype); refuse anything but a full
    match unless `allow_partial`. Returns what was loaded and what was not. `expert`: of a two-expert
    SRC (train.expert), that expert's weights."""
    source = open_source(src, raw, expert)
    stored = source.shapes
    own = model.state_dict()
    report = InitReport(str(src))
    for name, tensor in own.items():
        if name not in stored:
            report.new.append(name)
        elif stored[name] != tuple(tensor.shape):
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
    source.read({name: own[name] for name in report.loaded})
    return report
