"""`vidforge shard ANNOTATED_DIR -o OUT`: kept clips of `vidforge caption` to WebDataset tar shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, ShardsOutOpt, profile_from
from vidforge.cli._output import EXIT_PARTIAL, current_output


def shard(
    annotated_dir: Annotated[
        Path,
        typer.Argument(
            help="Output folder of `vidforge caption` (manifest.jsonl with keep, caption, media)."
        ),
    ],
    out: ShardsOutOpt,
    dedup: Annotated[
        Path | None,
        typer.Option("--dedup", help="A `vidforge dedup` output: the clips it dropped are not sharded."),
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Write the kept clips and images, their captions and caption embeddings (profile's text encoder) as
    WebDataset tar shards, split train/val by a hash of the key, optionally grouped by bucket.

    Writes OUT/{train,val}-NNNNNN.tar, OUT/index.json (per shard: samples, bytes, sha256; written last),
    manifest.jsonl and errors.jsonl. Exit code 3 when some records were rejected (see OUT/errors.jsonl).

    Example: vidforge shard runs/captioned -o runs/shards --set data.shard_max_samples=500
    """
    from vidforge.data.sharding import run

    resolved = profile_from(profile, set_)
    output = current_output()
    with output.shard_progress("shard") as on_shard:
        summary = run(resolved, annotated_dir, out, on_shard=on_shard, dedup=dedup)
    output.note_random_weights(summary.random_weights, "set text_encoder.path")
    output.result(summary.as_dict(), title="vidforge shard")
    if summary.skipped and not summary.written:
        output.info(
            f"nothing to do: all {summary.skipped} shard(s) were written by an earlier run (delete {out} to redo them)"
        )
    if summary.rejected:
        output.info(f"{summary.rejected} records rejected: see {out}/errors.jsonl")
        raise typer.Exit(EXIT_PARTIAL)
