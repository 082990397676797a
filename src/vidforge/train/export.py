"""Export for `infer`: one safetensors model (the EMA weights when there is an EMA) with its config, and
the profile the run trained with (so infer builds the same tokenizer and text encoder).

Under pipeline parallel each rank holds only its stages: every rank gathers its stage modules' weights
as full CPU tensors (FSDP / TP shards gathered collectively, in the same order on every rank of a shard
group), then the pipeline group exchanges them (`all_gather_object`) and rank 0 writes the merged whole."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from vidforge.files import output_folder, write_text
from vidforge.lora import save_adapter
from vidforge.models import build_model
from vidforge.profile import RunProfile, dump_profile
from vidforge.train.ema import EMA, Modules, as_module_list
from vidforge.weights.checkpoint import add_config_notes, save_model
from vidforge.weights.experts import record_expert

# Wrappers that activation checkpointing and torch.compile put into parameter names.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _full(t: torch.Tensor) -> torch.Tensor:
    # An FSDP shard (DTensor) is gathered; every rank must call this for every tensor, in the same order.
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def local_weights(modules: Modules, ema: EMA | None, frozen: bool = True) -> dict[str, torch.Tensor]:
    """This rank's modules' weights (the EMA's where there is one) as full fp32 CPU tensors, by clean
    name; `frozen=False` leaves out frozen parameters and buffers (a LoRA run's base: only its adapters
    are gathered). Collective over each module's shard group: every rank of it must call this."""
    modules = as_module_list(modules)
    weights: dict[str, torch.Tensor] = {}
    if ema is not None:
        for name, t in ema.state_dict().items():
            weights[clean_name(name)] = _full(t.detach()).float().cpu()
    for module in modules:
        if ema is None:
            for name, p in module.named_parameters():
                if clean_name(name) not in weights:
                    weights[clean_name(name)] = _full(p.detach()).float().cpu()
        # Buffers and frozen tensors are not in the EMA: take them from the trained model.
        trainable = {clean_name(name) for name, p in module.named_parameters() if p.requires_grad}
        for name, t in module.state_dict().items():
            if clean_name(name) not in weights and (frozen or clean_name(name) in trainable):
                weights[clean_name(name)] = _full(t.detach()).cpu()
    return weights


def export_weights(
    profile: RunProfile,
    modules: Modules,
    ema: EMA | None,
    out: str | Path,
    step: int,
    rank: int = 0,
    pp_group: dist.ProcessGroup | None = None,
    base: str | None = None,
) -> Path:
    """Write the whole model to `out` on rank 0. `modules`: the model, or this rank's pipeline stage
    modules with `pp_group` the pipeline group whose ranks hold the other stages. Every rank calls this.
    `step`, the training step the weights are from, goes into config.json (`step`) so that the samples
    drawn from the export say which step they came from. A LoRA run (train.lora) exports its adapters
    alone (`vidforge.lora.save_adapter`), recording `base`, the --init it was trained on; full weights record
    it in config.json too."""
    lora = profile.train.lora
    weights = local_weights(modules, ema, frozen=lora is None)
    if pp_group is not None:
        parts: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size(pp_group)
        dist.all_gather_object(parts, weights, group=pp_group)
        weights = {}
        for part in parts:
            for name, t in part.items():
                weights.setdefault(name, t)  # conditioning weights: equal on every stage
    out = Path(out)
    if rank == 0:
        output_folder(out)  # RUN/export a link out of the run is refused before anything is written
        if lora is not None:
            save_adapter(out, weights, profile.model, lora, step, base)
        else:
            plain = build_model(profile.model, device="cpu")
            plain.load_state_dict(weights, strict=True)
            save_model(plain, out)
            record_step(out, step)
            if base is not None:  # the weights' origin: LTX-2's published export takes its audio stream
                add_config_notes(out, base=base)  # and config entries from it
            if profile.train.expert is not None:  # one expert of two: infer pairs it with the other
                record_expert(out, profile.train.expert, base)
        write_text(out / "profile.yaml", dump_profile(profile))
        for written in out.iterdir():  # the weights came through a private temp file (0600): readable
            if written.is_file():  # like every other file, i.e. the mode profile.yaml got (0644)
                shutil.copymode(out / "profile.yaml", written)
    return out


def record_step(export: Path, step: int) -> None:
    """Add the training step to the export's config.json (read_config ignores keys beside `model`)."""
    add_config_notes(export, step=step)
