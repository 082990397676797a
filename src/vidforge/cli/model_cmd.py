"""`vidforge model import|export`: published model weights in and out of vidforge's export format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import current_output

OutDir = Annotated[Path, typer.Option("--out", "-o", help="Folder to write (created).")]

app = typer.Typer(
    help="Bring published weights (diffusers' Wan2.1 transformer) into a vidforge export, and back out.\n\n"
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
    """Read a diffusers Wan2.1 transformer (config.json, safetensors or shards with their index, float32
    or bfloat16) tensor by tensor and write a vidforge export: model.safetensors, config.json, and
    profile.yaml (the profile with the imported model section) for `vidforge infer` and fine-tuning.

    Example: vidforge model import Wan2.1-T2V-1.3B-Diffusers -o models/wan13b --profile local_cpu
    """
    from vidforge.models.wan_weights import import_wan

    written = import_wan(src, out, profile_from(profile, set_), dtype)
    current_output().result({"export": str(written)}, title="vidforge model import")


@app.command("export")
def export(
    export_dir: Annotated[
        Path, typer.Argument(help="A vidforge export folder (or a training run directory).")
    ],
    out: OutDir,
    to: Annotated[
        str, typer.Option("--to", help="Target format; diffusers is the one there is.")
    ] = "diffusers",
    max_shard_mb: Annotated[
        float, typer.Option("--max-shard-mb", min=0.001, help="Largest safetensors shard, in MiB.")
    ] = 5120.0,
) -> None:
    """Write a wan-family export as a diffusers WanTransformer3DModel folder (config.json, safetensors
    shards and their index) that `WanTransformer3DModel.from_pretrained` loads.

    Example: vidforge model export runs/train/export --to diffusers -o Wan2.1-finetuned/transformer
    """
    from vidforge.errors import UserInputError
    from vidforge.models.wan_weights import export_wan

    if to != "diffusers":
        raise UserInputError(f"--to {to}: the one export format is diffusers")
    written = export_wan(export_dir, out, int(max_shard_mb * 2**20))
    current_output().result({"diffusers": str(written)}, title="vidforge model export")
