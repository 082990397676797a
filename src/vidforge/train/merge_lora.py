"""`vidforge model export --merged`: a LoRA run's adapter folded into its base and written as a full vidforge export.
Above both the export (which writes it) and `--init`'s reader (which loads the base)."""

from __future__ import annotations

from pathlib import Path

from vidforge.errors import UserInputError
from vidforge.files import write_text
from vidforge.lora import load_adapter, merge, read_adapter
from vidforge.models import build_model
from vidforge.profile import dump_profile, load_profile
from vidforge.profile.model import Model
from vidforge.train.export import record_step
from vidforge.train.init_weights import init_from
from vidforge.weights.checkpoint import add_config_notes, save_model


def export_merged(adapter: str | Path, out: str | Path, base: str | Path | None = None) -> Path:
    """A LoRA run's adapter folded into its base (W + alpha / rank x B @ A per target) and written as a
    vidforge export at `out`: model.safetensors, config.json (with the adapter's step), profile.yaml.
    `base`: an export or a diffusers Wan folder, as `--init` takes; default the base the run recorded."""
    record = read_adapter(adapter)
    base = base if base is not None else record.get("base")
    if base is None:
        raise UserInputError(f"--base: {adapter} does not record the base it trained on; pass --base BASE")
    # the run's profile, less train.lora: these are full weights, to sample or fine-tune further
    trained = load_profile(record["folder"] / "profile.yaml", {"train.lora": None})
    model = build_model(Model.model_validate(record["model"]), device="cpu")
    # of a two-expert base, the expert the adapter trained on
    init_from(model, Path(base), allow_partial=False, expert=trained.train.expert)
    merge(load_adapter(model, record["folder"]))
    out = Path(out)
    save_model(model, out)
    record_step(out, record["step"])
    # the weights' origin: a family whose export carries more than the network's (LTX-2's audio stream
    # and published config entries) takes the rest from it
    add_config_notes(out, base=str(Path(base).resolve()))
    write_text(out / "profile.yaml", dump_profile(trained))
    return out
