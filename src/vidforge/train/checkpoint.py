"""Training checkpoints with torch.distributed.checkpoint (DCP): sharded, resharding on load, optional
async writes, complete only once marked.

Layout of a run directory:
    checkpoints/step_00000100/   DCP files: model, optimizer, EMA (sharded tensors, any layout can load),
                                 and a distillation's fake score with its optimizer (`fake_score.*`)
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

from vidforge.data.folder_lock import FolderLock, subfolder
from vidforge.data.manifest import atomic_path
from vidforge.errors import UserInputError
from vidforge.files import write_text
from vidforge.train import safe_dcp
from vidforge.train.ema import EMA, Modules, as_module_list

MARKER = "COMPLETE"
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
# Frozen parameters (LoRA's base) are not training state: they come from the build (its --init) again.
TRAINABLE = StateDictOptions(ignore_frozen_params=True)
# Loading them leaves the frozen ones as built; every trainable name is loaded (DCP raises on a missing one).
LOAD_TRAINABLE = StateDictOptions(ignore_frozen_params=True, strict=False)

Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer]
Companions = dict[str, tuple[nn.Module, torch.optim.Optimizer]]


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


# Model fields that choose how the same function is computed (a kernel, a preset's name): a run may resume
# with another. Every other model field, and the whole of train.lora, defines what the weights are.
RUNTIME_MODEL_FIELDS = ("preset", "attention", "sdpa_backend")


def run_identity(model: Any, lora: Any, init: str | None, teacher: str | None = None) -> dict[str, Any]:
    """What a run's checkpoints belong to, saved with each one and compared on `--resume`: the model's
    settings (`profile.model`), its LoRA settings (`profile.train.lora`) and, for LoRA, the base it adapts
    (`init`: the resolved --init, whose frozen weights the checkpoint does not hold); for a distillation
    the teacher (`train.distill.teacher`, resolved: its frozen weights are not in the checkpoint either)."""
    fields = {
        f"model.{k}": v for k, v in model.model_dump(mode="json").items() if k not in RUNTIME_MODEL_FIELDS
    }
    if lora is not None:
        fields |= {f"train.lora.{k}": v for k, v in lora.model_dump(mode="json").items()}
        fields["--init"] = init
    else:
        fields["train.lora"] = None
    if teacher is not None:
        fields["train.distill.teacher"] = teacher
    return fields


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
        # A planted `checkpoints` link is refused: the run would save (and resume) wherever it points.
        self.root = subfolder(run_dir, "checkpoints", create=False)
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
        companions: Companions | None = None,
    ) -> None:
        """Write checkpoint `step` of `modules` (one model, or this rank's pipeline stage modules) and their
        optimizers (one per module). `extra` is this rank's JSON-able state (loader position, scheduler).
        `companions`: other trained networks with their optimizers (a distillation's fake score), each
        saved under its name."""
        self.wait()
        path = self.path(step)
        if _rank() == 0 and path.exists():  # a half-written attempt at the same step
            shutil.rmtree(path)
        _barrier()
        model_sd, optim_sd, _ = merged_state(modules, optimizers)
        tensors = {"model": model_sd, "optim": optim_sd}
        if ema is not None:
            tensors["ema"] = ema.state_dict()
        for name, (module, optimizer) in (companions or {}).items():
            msd, osd, _ = merged_state([module], [optimizer])
            tensors[name] = {"model": msd, "optim": osd}
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
            write_text(self.path(step) / MARKER, str(step))
            for old in self.complete_steps()[: -self.keep]:
                shutil.rmtree(self.path(old), ignore_errors=True)
        _barrier()

    def rank_state(self, step: int, rank: int) -> dict[str, Any]:
        """Checkpoint `step`'s JSON state of `rank` (rank 0's when it holds none: resumed on more ranks
        than saved); a damaged file is one line naming it."""
        path = self.path(step)
        rank_file = path / f"rank{rank:05d}.json"
        if not rank_file.is_file():
            rank_file = path / "rank00000.json"
        try:
            state = json.loads(rank_file.read_text())
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as err:
            raise UserInputError(
                f"{rank_file}: damaged ({err}); resume from the checkpoint before it (remove {path}) or "
                "start a new --run-dir"
            ) from None
        return state

    def check_resume(self, step: int, identity: dict[str, Any]) -> None:
        """Refuse in one line, before anything loads, a `--resume` whose model or LoRA settings (or LoRA
        base) differ from those checkpoint `step` was saved with: DCP would fail on a changed shape with a
        long traceback, and a LoRA run would train its adapters on another base without a word."""
        saved = self.rank_state(step, 0).get("run")
        if not isinstance(saved, dict):
            return  # saved before runs recorded this: `load` still compares every tensor's shape
        changed = [k for k in sorted(saved.keys() | identity.keys()) if saved.get(k) != identity.get(k)]
        if not changed:
            return
        name = changed[0]
        more = f" (and {len(changed) - 1} more: {', '.join(changed[1:])})" if len(changed) > 1 else ""
        if name == "--init":
            raise UserInputError(
                f"--resume: the run's LoRA adapters were trained on --init {saved.get(name)}, this command "
                f"passes --init {identity.get(name)}; pass the run's --init again, or a new --run-dir"
            )
        raise UserInputError(
            f"--resume: the run was trained with {name}={_shown(saved.get(name))}, this command has "
            f"{name}={_shown(identity.get(name))}{more}; resume with the run's settings "
            f"({self.root.parent / 'profile.yaml'} before this command) or pass a new --run-dir"
        )

    def load(
        self,
        step: int,
        modules: Modules,
        optimizers: Optimizers,
        ema: EMA | None,
        companions: Companions | None = None,
    ) -> dict[str, Any]:
        """Load checkpoint `step` into the (possibly differently split and sharded) modules and optimizers
        (and `companions`, as `save` took them); returns this rank's extra state. Its RNG state is restored
        too."""
        path = self.path(step)
        model_sd, optim_sd, keys = merged_state(modules, optimizers)
        tensors: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        if ema is not None:
            tensors["ema"] = ema.state_dict()
        _check_shapes(path, model_sd, step)
        groups = [(tensors, _pairs(modules, optimizers), keys)]
        for name, (module, optimizer) in (companions or {}).items():
            msd, osd, own = merged_state([module], [optimizer])
            _check_shapes(path, msd, step, f"{name}.model")
            tensors[name] = {"model": msd, "optim": osd}
            groups.append((tensors[name], [(module, optimizer)], own))
        safe_dcp.load(tensors, path)  # a checkpoint is data: resuming must not run its pickles
        for saved, pairs, group_keys in groups:
            for (module, optimizer), (model_keys, optim_keys) in zip(pairs, group_keys, strict=True):
                set_model_state_dict(
                    module, {k: saved["model"][k] for k in model_keys}, options=LOAD_TRAINABLE
                )
                set_optimizer_state_dict(
                    module, optimizer, {k: saved["optim"][k] for k in optim_keys}, options=FLAT
                )
        if ema is not None:
            ema.load_state_dict(tensors["ema"])
        extra = self.rank_state(step, _rank())
        set_rng_state(extra.pop("rng"))
        return extra


def _shown(value: Any) -> str:
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value


def _check_shapes(path: Path, model_sd: dict[str, Any], step: int, key: str = "model") -> None:
    """Every trainable tensor of this build must be in checkpoint `path` with the shape it has here (the
    recorded settings may predate `check_resume`, or a change may hide outside them)."""
    saved = safe_dcp.read_metadata(path / ".metadata").state_dict_metadata
    for name, value in model_sd.items():
        entry = saved.get(f"{key}.{name}")
        if entry is None or not hasattr(entry, "size"):
            raise UserInputError(
                f"--resume: checkpoint step {step} holds no {name}, which this model trains; resume with "
                "the model and train.lora settings the run was trained with, or pass a new --run-dir"
            )
        if tuple(entry.size) != tuple(value.shape):
            raise UserInputError(
                f"--resume: {name} is {list(entry.size)} in checkpoint step {step}, {list(value.shape)} in "
                "this model; resume with the model and train.lora settings the run was trained with, or "
                "pass a new --run-dir"
            )
