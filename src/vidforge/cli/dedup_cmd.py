"""`vidforge dedup RUN... -o OUT`: semantic dedup across runs (calls vidforge.curate.embeddings.semdedup.run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, parse_sets, profile_from
from vidforge.cli._output import EXIT_PARTIAL, StageBars, current_output
from vidforge.cli._terminal import printable
from vidforge.profile.overrides import as_overrides


def dedup(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="`vidforge clip` outputs (their embeddings/ stores); earlier runs win ties.",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (dropped.jsonl, summary.json).")],
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            help="Cosine at or above which two clips are duplicates (the profile's by default).",
        ),
    ] = None,
    keep: Annotated[
        str | None, typer.Option("--keep", help="first, aesthetic or longest (the profile's by default).")
    ] = None,
    executor: Annotated[str, typer.Option("--executor", help="local or ray.")] = "local",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster to join; default: a local Ray instance.")
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Drop near-duplicate clips across runs: k-means over the clip embeddings, pairwise cosine within
    each cluster and its neighbours; each dropped clip is recorded with the clip it duplicates. Reruns
    resume by cluster. `vidforge shard --dedup OUT` leaves the dropped clips out.

    Example: vidforge dedup runs/clips-mon runs/clips-tue -o runs/dedup --threshold 0.95
    """
    from vidforge.curate.embeddings.semdedup import run

    flags = {"curation.semantic_dedup.threshold": threshold, "curation.semantic_dedup.keep": keep}
    overrides = [*parse_sets(set_), *as_overrides({k: v for k, v in flags.items() if v is not None})]
    resolved = profile_from(profile, overrides)
    output = current_output()
    progress = StageBars(output) if output.show_progress else None

    def started(info: dict) -> None:
        output.note_random_weights(
            _random_embedders(runs), "embed the clips with trained weights: curation.embed_checkpoint"
        )
        output.info(f"{info['clips']} clip(s) in {info['clusters']} cluster(s), {info['todo']} to compare")
        if progress is not None:
            progress.start({"pairs": info["todo"]})

    try:
        summary = run(
            resolved,
            runs,
            out,
            executor=executor,
            ray_address=ray_address,
            monitor=progress.update if progress else None,
            on_start=started,
        )
    finally:
        if progress is not None:
            progress.stop()
    shown = {k: v for k, v in summary.items() if k != "not_finite_ids"}  # named below, escaped
    output.result(shown | {"out": str(out)}, title="vidforge dedup")
    if summary["not_finite"]:
        output.info(
            f"[yellow]{summary['not_finite']} clip(s) have a stored vector that is not finite (NaN or inf)[/]: "
            f"compared with nothing and kept ({printable(', '.join(summary['not_finite_ids']))}"
            f"{', ...' if summary['not_finite'] > 10 else ''}); rerun `vidforge clip` on their sources"
        )
    if summary["errors"]:
        output.info(f"[yellow]{summary['errors']} cluster(s) failed[/]: rerun to redo them")
        raise typer.Exit(EXIT_PARTIAL)


def _random_embedders(runs: list[Path]) -> list[str]:
    """The embedders of `runs` that had no trained weights, as their stores recorded them (no checkpoint and
    no `local-dir:` folder, `vidforge.curate.embeddings.embedder`'s rule): duplicates among random-weight vectors
    are duplicates of noise."""
    from vidforge.data.embeddings import EmbeddingStore

    found = []
    for run in runs:
        model = EmbeddingStore.open(run).model  # opened (and checked) by the run that calls this
        name = str(model.get("name"))
        if not model.get("checkpoint") and not name.startswith("local-dir:"):
            found.append(printable(f"embeddings of {run} ({name})"))  # the name is data: escaped
    return found
