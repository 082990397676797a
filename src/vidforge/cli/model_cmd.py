"""`vidforge model import|export`: published model weights in and out of vidforge's export format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, parse_sets
from vidforge.cli._output import current_output
from vidforge.profile.overrides import command_line

OutDir = Annotated[Path, typer.Option("--out", "-o", help="Folder to write (created).")]

app = typer.Typer(
    help="Bring published weights (diffusers' Wan2.1 and Wan2.2 folders) into a vidforge export, and back out.\n\n"
    "Example: vidforge model import Wan2.1-T2V-1.3B-Diffusers -o models/wan13b",
    no_args_is_help=True,
)


@app.command("import")
def import_(
    src: Annotated[
        Path, typer.Argument(help="A diffusers WanTransformer3DModel folder, or a Wan pipeline folder.")
    ],
    out: OutDir,
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help="Cast every tensor: float32 or bfloat16 (default: keep the weights')."),
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Read a diffusers Wan transformer or pipeline folder (config.json, safetensors or shards with their
    index, float32 or bfloat16; both experts of a Wan2.2 A14B) tensor by tensor and write a vidforge
    export: model.safetensors, config.json, and profile.yaml (the profile that trains and samples it as
    published: the imported model section, the objective the weights were trained with and the
    scheduler's shift, the pipeline's VAE, umT5 and image encoder). `vidforge infer -c OUT` samples it;
    `vidforge train --init OUT --profile OUT/profile.yaml` fine-tunes it (without --init, the profile
    trains a model of that shape from scratch).

    Example: vidforge model import Wan2.1-T2V-1.3B-Diffusers -o models/wan13b --profile local_cpu
    """
    from vidforge.errors import UserInputError
    from vidforge.weights import weights_folder

    found = weights_folder.resolve_weights(src, "model import")
    if found.published is None:
        raise UserInputError(
            f"model import {src}: already a vidforge export ({found.export}); train or sample it as it is"
        )
    resolved = weights_folder.published_profile(found.published, parse_sets(set_), profile)
    written = weights_folder.import_published(found.published, out, resolved, dtype)
    current_output().result(
        {
            "export": str(written),
            "sample": command_line("vidforge", "infer", "-c", written, "--prompt", "TEXT", "-o", "OUT"),
            "fine-tune": command_line(
                "vidforge",
                "train",
                "--init",
                written,
                "--profile",
                written / "profile.yaml",
                "--data",
                "LATENTS",
                "--run-dir",
                "RUN",
            ),  # fmt: skip
        },
        title="vidforge model import",
    )


@app.command("export")
def export(
    export_dir: Annotated[
        Path,
        typer.Argument(
            help="A vidforge export folder (or a training run directory); with --merged a LoRA run's."
        ),
    ],
    out: OutDir,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="diffusers (a WanTransformer3DModel folder), vidforge (with --merged), or comfyui (a LoRA "
            "run's adapter as the file ComfyUI's LoraLoader loads).",
        ),
    ] = "diffusers",
    max_shard_mb: Annotated[
        float, typer.Option("--max-shard-mb", min=0.001, help="Largest safetensors shard, in MiB.")
    ] = 5120.0,
    merged: Annotated[
        bool,
        typer.Option("--merged", help="Fold a LoRA run's adapter into its base and write full weights."),
    ] = False,
    base: Annotated[
        Path | None,
        typer.Option("--base", help="With --merged: the base (default: the --init the LoRA run recorded)."),
    ] = None,
) -> None:
    """Write a wan-family export as a diffusers WanTransformer3DModel folder (config.json, safetensors
    shards and their index) that `WanTransformer3DModel.from_pretrained` loads. With --merged, a LoRA
    run's adapter folded into its base: full weights, as diffusers (wan) or as a vidforge export. With
    --to comfyui, a LoRA run's adapter as lora_comfyui.safetensors, under the names of ComfyUI's model.

    Example: vidforge model export runs/train/export --to diffusers -o Wan2.1-finetuned/transformer
    Example: vidforge model export runs/wan_lora --merged -o runs/wan_lora_merged/transformer
    Example: vidforge model export runs/wan_lora --to comfyui -o ComfyUI/models/loras/wan_lora
    """
    import tempfile

    from vidforge.errors import UserInputError
    from vidforge.lora.comfyui import export_comfyui
    from vidforge.train.merge_lora import export_merged
    from vidforge.weights.weights_folder import export_published

    if (
        to not in ("diffusers", "vidforge", "comfyui")
        or (to == "vidforge" and not merged)
        or (to == "comfyui" and merged)
    ):
        raise UserInputError(f"--to {to}: diffusers, vidforge with --merged, or comfyui without --merged")
    if to != "vidforge":
        _refuse_clean_prediction(export_dir)
    if to == "comfyui":
        written = export_comfyui(export_dir, out)
    elif not merged:
        _refuse_adapter(export_dir)
        written = export_published(export_dir, out, int(max_shard_mb * 2**20))
    elif to == "vidforge":
        written = export_merged(export_dir, out, base)
    else:  # merged full weights in vidforge's format first, then as diffusers' folder
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
            written = export_published(
                export_merged(export_dir, Path(tmp) / "merged", base), out, int(max_shard_mb * 2**20)
            )
    current_output().result({to: str(written), **_other_expert(export_dir)}, title="vidforge model export")


def _other_expert(export_dir: Path) -> dict[str, str]:
    """Of a two-expert export (Wan2.2 A14B), where its low-noise expert is and how to export it too."""
    from vidforge.weights.experts import LOW
    from vidforge.weights.weights_folder import export_folder

    folder = export_folder(export_dir)
    if (folder / LOW / "config.json").is_file():
        return {
            "low_noise": "not written; "
            + command_line("vidforge", "model", "export", folder / LOW, "-o", "PIPELINE/transformer_2")
        }
    return {}


def _refuse_adapter(export_dir: Path) -> None:
    """A LoRA run's export is an adapter, already in diffusers' LoRA format: nothing to convert alone."""
    from vidforge import lora
    from vidforge.errors import UserInputError

    try:
        adapter = lora.read_adapter(export_dir)
    except UserInputError:
        return
    raise UserInputError(
        f"{export_dir}: a LoRA run; {adapter['folder']} already is a diffusers LoRA "
        "(the pipeline's load_lora_weights, or its transformer's load_lora_adapter, loads it as it is); "
        "add --merged to fold it into its base and write full weights, or --to comfyui for ComfyUI's LoraLoader"
    )


def _refuse_clean_prediction(export_dir: Path) -> None:
    """Diffusers' and ComfyUI's Wan pipelines read the transformer's output as a velocity: a model (or a
    LoRA) trained to output clean latents (diffusion.flow_prediction=clean) would sample noise there."""
    from vidforge import lora
    from vidforge.errors import UserInputError
    from vidforge.profile import load_profile
    from vidforge.weights.weights_folder import export_profile, find_weights

    found = find_weights(export_dir)
    if found is not None and found.export is not None and (found.export / "profile.yaml").is_file():
        trained = export_profile(found.export, [])
    else:
        try:  # a LoRA run's adapter, with the profile it trained with beside it
            folder = lora.read_adapter(export_dir)["folder"]
        except UserInputError:
            return  # neither: the export itself says what is wrong with it
        if not (folder / "profile.yaml").is_file():
            return
        trained = load_profile(folder / "profile.yaml")
    if trained.diffusion.flow_prediction == "clean":
        raise UserInputError(
            f"{export_dir}: trained with diffusion.flow_prediction=clean, but diffusers' and ComfyUI's Wan "
            "pipelines read the output as a velocity; sample it with `vidforge infer` instead"
        )
