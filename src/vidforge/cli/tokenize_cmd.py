"""`vidforge tokenize SHARDS_DIR -o OUT`: media shards to latent shards with the profile's video tokenizer."""

from __future__ import annotations

from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, ShardsOutOpt, profile_from
from vidforge.cli._output import EXIT_PARTIAL, current_output


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
    with output.shard_progress("tokenize") as on_shard:
        summary = run(resolved, shards_dir, out, on_shard=on_shard)
    output.result(summary.as_dict(), title="vidforge tokenize")
    if summary.rejected:
        output.info(f"{summary.rejected} samples or shards rejected: see {out}/errors.jsonl")
        raise typer.Exit(EXIT_PARTIAL)
