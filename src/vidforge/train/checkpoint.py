"""Training checkpoints with torch.distributed.checkpoint (DCP): sharded, resharding on load, optional
async writes, complete only once marked.

Layout of a run directory:
    checkpoints/step_00000100/   DCP files: model, optimizer, EMA (sharded tensors, any layout can load)
    checkpoints/step_00000100/rank00000.json        per-rank state: step, loader, scheduler, RNG
    checkpoints/step_00000100/COMPLETE              written last, after every rank finished
`latest()` only ever returns a marked checkpoint, so a run killed while saving resumes from the one before.

Model and optimizer state are saved per module and merged (torchtitan's ModelWrapper / OptimizersContainer):
a pipeline-parallel rank holds several stage modules with one optimizer each, whose parameter names are
the whole model's. The optimizer state is in DCP's flattened form (`state.<param>.<key>`,
`param_groups.<param>.<key>`), keyed by parameter name alone, so any layout (pipeline stages or one
module, sharded or not) loads a checkpoint of any other. Conditioning parameters live on every stage
with equal values; their repeated names are kept once. Frozen parameters are left out: a LoRA run's
checkpoints hold its adapters and their optimizer state only (the base comes from its --init again).
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from vidforge.data.folder_lock import FolderLock
from vidforge.data.manifest import atomic_path
from vidforge.train import safe_dcp
from vidforge.train.ema import EMA, Modules, as_module_list

MARKER = "COMPLETE"
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
# Frozen parameters (LoRA's base) are not training state: they come from the build (its --init) again.
TRAINABLE = StateDictOptions(ignore_frozen_params=True)
# Loading them leaves the frozen ones as built; every trainable name is loaded (DCP raises on a missing one).
LOAD_TRAINABLE = StateDictOptions(ignore_frozen_params=True, strict=False)

Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """torch's generators (all a training step draws from), as JSON: base64 of their byte states."""

    def b64(t: torch.Tensor) -> str:
        return base64.b64encode(t.cpu().numpy().tobytes()).decode()

    return {
        "torch": b64(torch.get_rng_state()),
        "cuda": [b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    def unb64(s: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)

    torch.set_rng_state(unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([unb64(s) for s in state["cuda"]])


def _pairs(modules: Modules, optimizers: Optimizers) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
    modules = as_module_list(modules)
    optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    if len(modules) != len(optimizers):
        raise ValueError(
            f"one optimizer per module: got {len(modules)} module(s), {len(optimizers)} optimizer(s)"
        )
    return list(zip(modules, optimizers, strict=True))


def merged_state(
    modules: Modules, optimizers: Optimizers
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[list[str], list[str]]]]:
    """The modules' model and (flattened) optimizer state dicts merged by name, and each module's own
    (model keys, optimizer keys) to load them back with. A repeated name keeps the first module's tensor."""
    model_sd: dict[str, Any] = {}
    optim_sd: dict[str, Any] = {}
    keys = []
    for module, optimizer in _pairs(modules, optimizers):
        msd = get_model_state_dict(module, options=TRAINABLE)
        osd = get_optimizer_state_dict(module, optimizer, options=FLAT)
        for name, value in msd.items():
            model_sd.setdefault(name, value)
        for name, value in osd.items():
            optim_sd.setdefault(name, value)
        keys.append((list(msd), list(osd)))
    return model_sd, optim_sd, keys


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def complete_steps(root: Path) -> list[int]:
    """The steps of the complete checkpoints under `root` (RUN/checkpoints), in order."""
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / MARKER).is_file())


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The folder of a run directory's latest complete checkpoint, or None."""
    root = Path(run_dir) / "checkpoints"
    steps = complete_steps(root)
    return step_dir(root, steps[-1]) if steps else None


class CheckpointManager:
    """Saves and finds checkpoints of one run directory."""

    def __init__(self, run_dir: str | Path, keep: int = 3, use_async: bool = False):
        # One training run writes a run directory at a time (rank 0 holds the lock for all its ranks).
        self._lock = FolderLock(run_dir) if _rank() == 0 else None
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.use_async = use_async
        self._pending: Future | None = None

    def path(self, step: int) -> Path:
        return step_dir(self.root, step)

    def complete_steps(self) -> list[int]:
        return complete_steps(self.root)

    def latest(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def save(
        self,
        step: int,
        modules: Modules,
        optimizers: Optimizers,
        ema: EMA | None,
        extra: dict[str, Any],
    ) -> None:
        """Write checkpoint `step` of `modules` (one model, or this rank's pipeline stage modules) and their
        optimizers (one per module). `extra` is this rank's JSON-able state (loader position, scheduler)."""
        self.wait()
        path = self.path(step)
        if _rank() == 0 and path.exists():  # a half-written attempt at the same step
            shutil.rmtree(path)
        _barrier()
        model_sd, optim_sd, _ = merged_state(modules, optimizers)
        tensors = {"model": model_sd, "optim": optim_sd}
        if ema is not None:
            tensors["ema"] = ema.state_dict()
        with atomic_path(path / f"rank{_rank():05d}.json") as tmp:
            tmp.write_text(json.dumps({"step": step, "rng": rng_state(), **extra}))
        if self.use_async and dist.is_initialized():
            self._pending = dcp.async_save(tensors, checkpoint_id=str(path))
            self._pending_step = step
        else:
            with safe_dcp.single_process_ok():
                dcp.save(tensors, checkpoint_id=str(path))
            self._finish(step)

    def wait(self) -> None:
        """Block until an async save is on disk, then mark it complete."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None
            self._finish(self._pending_step)

    def _finish(self, step: int) -> None:
        _barrier()
        if _rank() == 0:
            (self.path(step) / MARKER).write_text(str(step))
            for old in self.complete_steps()[: -self.keep]:
                shutil.rmtree(self.path(old), ignore_errors=True)
        _barrier()

    def load(self, step: int, modules: Modules, optimizers: Optimizers, ema: EMA | None) -> dict[str, Any]:
        """Load checkpoint `step` into the (possibly differently split and sharded) modules and optimizers;
        returns this rank's extra state. Its RNG state is restored too."""
        path = self.path(step)
        model_sd, optim_sd, keys = merged_state(modules, optimizers)
        tensors: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        if ema is not None:
            tensors["ema"] = ema.state_dict()
        safe_dcp.load(tensors, path)  # a checkpoint is data: resuming must not run its pickles
        for (module, optimizer), (model_keys, optim_keys) in zip(
            _pairs(modules, optimizers), keys, strict=True
        ):
            set_model_state_dict(module, {k: tensors["model"][k] for k in model_keys}, options=LOAD_TRAINABLE)
            set_optimizer_state_dict(
                module, optimizer, {k: tensors["optim"][k] for k in optim_keys}, options=FLAT
            )
        if ema is not None:
            ema.load_state_dict(tensors["ema"])
        rank_file = path / f"rank{_rank():05d}.json"
        if not rank_file.is_file():  # resumed on more ranks than saved: start from rank 0's position
            rank_file = path / "rank00000.json"
        extra = json.loads(rank_file.read_text())
        set_rng_state(extra.pop("rng"))
        return extra
