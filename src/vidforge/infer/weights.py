"""What `vidforge infer -c` samples: a training run's export or a published folder (through
`vidforge.weights.weights_folder`, the one reader of weight folders), its profile, and the network loaded
with its LoRA adapter if given."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from vidforge.errors import UserInputError
from vidforge.profile import RunProfile, load_profile
from vidforge.profile.diffusion import FEW_STEP
from vidforge.profile.model import Model
from vidforge.profile.overrides import Override, Settings, as_overrides
from vidforge.weights import weights_folder
from vidforge.weights.checkpoint import CONFIG, config_notes
from vidforge.weights.experts import Experts, load_export, paired_export, trained_expert
from vidforge.weights.weights_folder import WeightsFolder


def find_weights(checkpoint: str | Path) -> WeightsFolder:
    """The checkpoint as an export (a run directory's export/ or an export folder) or a published
    folder (`vidforge.weights.weights_folder`); a LoRA adapter or anything else is a UserInputError."""
    found = weights_folder.find_weights(checkpoint)
    if found is not None:
        return found
    from vidforge.lora import find_adapter

    if find_adapter(checkpoint) is not None:
        raise UserInputError(
            f"--checkpoint {checkpoint}: a LoRA adapter, not a model; pass its base as --checkpoint and this "
            "folder as --lora"
        )
    return weights_folder.resolve_weights(checkpoint, "--checkpoint")


def find_export(checkpoint: str | Path) -> Path | None:
    """The folder holding model.safetensors + config.json: CHECKPOINT/export or CHECKPOINT itself; None
    for a published folder; otherwise a UserInputError."""
    return find_weights(checkpoint).export


def exported_step(export: Path) -> int | None:
    """The training step an export's weights are from (`vidforge.train.export.record_step` writes it);
    None for an export written before steps were recorded."""
    return config_notes(export).get("step")


def checkpoint_profile(export: Path, overrides: Settings, profile: str | None = None) -> RunProfile:
    """The profile the model trained with (or `profile` if given), with `overrides` applied."""
    return weights_folder.export_profile(export, overrides, profile)


def sampling_profile(weights: WeightsFolder, overrides: Settings, profile: str | None = None) -> RunProfile:
    """An export's profile (the one it trained with), or a published folder's as published. Its model
    section is the weights' but for the attention settings (`load_network` builds it so); any other
    model field set otherwise is refused (`weights_folder.check_sampled`)."""
    if weights.export is not None:
        prof = checkpoint_profile(weights.export, overrides, profile)
    else:
        prof = weights_folder.published_profile(weights.published, overrides, profile)
    weights_folder.check_sampled(prof.model, weights_folder.weights_model(weights), str(weights.path))
    return prof


def adapter_sampling(lora: str | Path) -> list[Override]:
    """The sampling settings of a LoRA adapter's run when it distilled a few-step student (train.distill
    wrote diffusion.sampler=few-step into its profile), as overrides of the base's profile; else none."""
    from vidforge.lora import read_adapter

    path = read_adapter(lora)["folder"] / "profile.yaml"
    if not path.is_file():
        return []
    diffusion = load_profile(path).diffusion
    if diffusion.sampler != FEW_STEP:
        return []
    return as_overrides(
        {
            "diffusion.sampler": FEW_STEP,
            "diffusion.few_step_levels": list(diffusion.few_step_levels),
            "diffusion.few_step_noise": diffusion.few_step_noise,
            "diffusion.steps": diffusion.steps,
            "diffusion.guidance": diffusion.guidance,
        }
    )


def load_network(
    weights: WeightsFolder,
    device: str,
    lora: str | Path | None = None,
    lora_scale: float = 1.0,
    runtime: Model | None = None,
) -> nn.Module:
    """The network of `weights` on `device` in eval mode, with the LoRA adapter at `lora` if given, running
    with the attention settings of the model section `runtime` (the sampling profile's) if given."""
    if weights.export is not None:
        # both experts of a two-expert export
        model = load_export(weights.export, device=device, runtime=runtime)
        if trained_expert(weights.export) is not None:
            model = paired_expert(weights.export, model, device, runtime)
    else:
        model = weights_folder.load_published(weights.published, device=device, runtime=runtime)
    if lora is not None:
        from vidforge.lora import load_adapter

        if isinstance(model, Experts):  # the adapter goes on the expert its run trained
            expert = adapter_expert(lora)
            load_adapter(getattr(model, expert), lora, lora_scale)
            pair = _adapter_pair(lora, expert)
            if pair is not None:  # a curriculum's adapter of the other expert: on that one
                load_adapter(getattr(model, adapter_expert(pair)), pair, lora_scale)
        else:
            model = load_adapter(model, lora, lora_scale)
    return model.eval()


def paired_expert(export: Path, trained: nn.Module, device: str, runtime: Model | None = None) -> Experts:
    """A one-expert run's expert with the other expert: the one its curriculum trained
    (`vidforge.weights.experts.record_pair`), else that of the weights it started from (its `--init`)."""
    expert, base = trained_expert(export)
    pair = paired_export(export)
    if pair is not None:
        if not (pair / CONFIG).is_file():
            raise UserInputError(
                f"{export}: the other expert's export its curriculum recorded, {pair}, is not there; keep "
                "the run directory whole (RUN/stages/*)"
            )
        other = load_export(pair, device=device, runtime=runtime)
        held = trained_expert(pair)
        if held is None or held[0] == expert:
            raise UserInputError(f"{export}: its paired export {pair} is not the other expert's; train again")
        high, low = (trained, other) if expert == "high" else (other, trained)
        return Experts(high, low, trained.config.boundary_ratio)
    found = weights_folder.find_weights(base) if base is not None and Path(base).is_dir() else None
    if found is None:
        raise UserInputError(
            f"{export}: holds the {expert}-noise expert alone and its --init {base} (the other expert) is "
            "not there; sample it beside that download (or its import) at the path the run recorded"
        )
    both = load_network(found, device, runtime=runtime)
    if not isinstance(both, Experts):
        raise UserInputError(f"{export}: its --init {base} holds one network, not two experts")
    high, low = (trained, both.low) if expert == "high" else (both.high, trained)
    return Experts(high, low, trained.config.boundary_ratio)


def _adapter_pair(lora: str | Path, expert: str) -> Path | None:
    """The other expert's adapter a curriculum recorded beside the LoRA adapter at `lora`; None if none."""
    from vidforge.lora import read_adapter

    pair = paired_export(read_adapter(lora)["folder"])
    if pair is not None and adapter_expert(pair) == expert:
        raise UserInputError(
            f"--lora {lora}: its paired adapter {pair} is not the other expert's; train again"
        )
    return pair


def adapter_expert(lora: str | Path) -> str:
    """The expert (`high` or `low`) a LoRA run on a two-expert model trained (its profile's train.expert)."""
    from vidforge.lora import read_adapter

    path = read_adapter(lora)["folder"] / "profile.yaml"
    expert = load_profile(path).train.expert if path.is_file() else None
    if expert is None:
        raise UserInputError(
            f"--lora {lora}: trained on a one-expert model, the checkpoint has two experts; pass the LoRA of "
            "a run with train.expert set (high or low), or the one-expert base it was trained on"
        )
    return expert
