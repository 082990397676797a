"""`vidforge review RUN_DIR [-o DIR]`: a page to look at what a run produced."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._output import current_output


def review(
    run_dir: Annotated[Path, typer.Argument(help="A clip, caption, infer or train output folder.")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Folder for index.html, thumbs/ and plots/ (default RUN_DIR/review)."
        ),
    ] = None,
) -> None:
    """Write a page that opens from disk with no server: for a curation run every clip (thumbnail strip,
    click to play) with its source, time range, caption, scores and keep/reject reasons, sortable and
    filterable, and the score histograms with the thresholds marked; for an infer output every sample with
    its prompt, seed, sampler, steps, guidance and checkpoint step; for a train run the loss, learning rate,
    gradient norm, step time and MFU curves and the validation samples. Large runs are paged.

    Example: vidforge review runs/captioned && xdg-open runs/captioned/review/index.html
    Example: vidforge review runs/samples -o /tmp/samples_review
    """
    from vidforge.review.build import run

    output = current_output()
    if not output.show_progress:  # no line per thumbnail in --json: 10,000 of them say nothing to cron
        result = run(run_dir, out)
    else:
        with output.shard_progress("thumbnails") as advance:
            result = run(run_dir, out, progress=lambda done, total: advance({}, total))
    output.result(
        {
            "page": result.page,
            "kind": result.kind,
            "items": result.items,
            "thumbs": result.thumbs,
            "seconds": round(result.seconds, 3),
        },
        text=f"{result.kind} review of {result.items} items: {result.page}",
    )
