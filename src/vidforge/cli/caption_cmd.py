"""`vidforge caption CLIPS_DIR -o OUT`: caption and quality-annotate the clips of a `vidforge clip` run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import EXIT_PARTIAL, current_output


def caption(
    clips_dir: Annotated[
        Path, typer.Argument(help="Output folder of `vidforge clip` (its manifest.jsonl and clips/).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (created; a rerun resumes it).")],
    limit: Annotated[
        int | None, typer.Option("--limit", help="Annotate only the first N clips.", min=1)
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Caption every clip (CoCa, a VLM endpoint or source sidecars) and record aesthetic, on-screen text,
    motion and caption-video match; each clip ends with keep true/false and its reasons.

    Writes OUT/manifest.jsonl, rejected.jsonl, errors.jsonl, summary.json, histograms.png and clips/.
    Exit code 3 when some clips failed (see OUT/errors.jsonl).

    Example: vidforge caption runs/clips -o runs/captioned --set curation.caption.backend=endpoint
    """
    from vidforge.curate.caption import run

    resolved = profile_from(profile, set_)
    output = current_output()
    if output.show_progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("caption"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=output.err_console,
            transient=True,
        ) as bar:
            task = bar.add_task("caption", total=None)
            summary = run(
                resolved,
                clips_dir,
                out,
                limit=limit,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    else:
        summary = run(
            resolved,
            clips_dir,
            out,
            limit=limit,
            progress=lambda done, total: output.event("progress", done=done, total=total),
        )
    data = summary.as_dict()
    if output.json:
        output.result(data)
    else:
        rows = [(reason, count) for reason, count in summary.by_reason.items() if count or ":" not in reason]
        output.table(rows, columns=("rejected for", "clips"), title="vidforge caption")
        output.table(
            [(step, t["clips"], t["seconds"], t["clips_per_s"]) for step, t in summary.timings.items()],
            columns=("annotation", "clips", "seconds", "clips/s"),
        )
        note = f"; random weights: {', '.join(summary.random_weights)}" if summary.random_weights else ""
        output.result(
            {},
            text=f"{summary.kept} kept, {summary.rejected} rejected, {summary.errors} errors of "
            f"{summary.clips} clips ({summary.skipped} already done) -> {summary.out}{note}",
        )
    if summary.errors:
        raise typer.Exit(EXIT_PARTIAL)
