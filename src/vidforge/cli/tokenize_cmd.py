"""`vidforge tokenize SHARDS_DIR -o OUT`: media shards to latent shards with the profile's video tokenizer;
`vidforge tokenize finetune CLIPS_OR_SHARDS --run-dir RUN`: fine-tune (or grow) the VAE it encodes with.

`tokenize` is a group whose default command is `encode`: arguments that do not start with one of its
command names run `encode`, so `vidforge tokenize SRC -o OUT` (the stage's short form) and
`vidforge tokenize encode SRC -o OUT` are the same, and `finetune` is a sub-command beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from vidforge.cli._options import ProfileOpt, SetOpt, ShardsOutOpt, profile_from
from vidforge.cli._output import EXIT_PARTIAL, current_output

DEFAULT = "encode"


class DefaultCommandGroup(TyperGroup):
    """A group that runs DEFAULT when the first argument names none of its commands (nor asks for help)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [DEFAULT, *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=DefaultCommandGroup,
    no_args_is_help=True,
    help="Encode media shards to latent shards (`vidforge tokenize SRC -o OUT`, the same as `tokenize encode`), "
    "or fine-tune the VAE that encodes them (`tokenize finetune`).\n\n"
    "Example: vidforge tokenize runs/shards -o runs/latents\n"
    "Example: vidforge tokenize finetune runs/clips --run-dir runs/vae_ft --set tokenizer.kind=wan "
    "--set tokenizer.path=models/wan-vae",
)


@app.command(DEFAULT)
def tokenize(
    shards_dir: Annotated[
        str, typer.Argument(help="Output folder of `vidforge shard` (its index.json and tars), or its URL.")
    ],
    out: ShardsOutOpt,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Encode every clip and image to latents (C, T, H, W) with a causal 3D VAE (Wan by default; CogVideoX,
    HunyuanVideo, LTX) or the weight-free pixel tokenizer, after resizing and cropping to the profile's
    buckets; text embeddings and metadata are carried over. Under torchrun each rank takes its own shards.

    Writes OUT/<same shard names>.tar with <key>.latent.npy, OUT/index.json (written last), manifest.jsonl
    and errors.jsonl. Exit code 3 when some samples were rejected (see OUT/errors.jsonl).

    Example: vidforge tokenize runs/shards -o runs/latents --set tokenizer.kind=wan --set tokenizer.path=models/wan-vae
    """
    from vidforge.tokenizers.tokenize import run

    resolved = profile_from(profile, set_)
    output = current_output()
    with (
        output.shard_progress("tokenize", bar=False) as on_shard,
        output.sample_progress("tokenize") as on_sample,
    ):
        summary = run(resolved, shards_dir, out, on_shard=on_shard, on_sample=on_sample)
    output.result(summary.as_dict(), title="vidforge tokenize")
    if summary.rejected:
        output.info(f"{summary.rejected} samples or shards rejected: see {out}/errors.jsonl")
        raise typer.Exit(EXIT_PARTIAL)


@app.command("finetune")
def finetune(
    src: Annotated[
        Path,
        typer.Argument(
            help="A clips folder (`vidforge clip`/`caption` output) or media shards (`vidforge shard`)."
        ),
    ],
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Run folder (created; a rerun resumes from its checkpoint).")
    ],
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Fine-tune the diffusers VAE at tokenizer.path (Wan) on the clips: MSE/L1, KL, LPIPS and a patch-GAN
    loss from tokenizer.finetune.gan_start; grown by tokenizer.finetune.extra_spatial_levels (16x spatial),
    every pretrained tensor that fits loaded. Under torchrun, FSDP2 over the ranks.

    Writes RUN/metrics.jsonl (each loss; held-out PSNR, SSIM, LPIPS), RUN/grids/*.png (originals above
    reconstructions), RUN/checkpoints/ and RUN/vae/, a diffusers folder: --set tokenizer.path=RUN/vae.

    Example: vidforge tokenize finetune runs/clips --run-dir runs/vae_ft --set tokenizer.kind=wan --set tokenizer.path=models/wan-vae
    """
    from vidforge.train.tokenizer_finetune import run

    resolved = profile_from(profile, set_)
    output = current_output()
    summary = run(resolved, src, run_dir)
    output.result(summary, title="vidforge tokenize finetune")
