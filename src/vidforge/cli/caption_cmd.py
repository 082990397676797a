"""`vidforge caption CLIPS_DIR -o OUT`: caption and quality-annotate the clips of a `vidforge clip` run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import EXIT_PARTIAL, StageBars, current_output


def caption(
    clips_dir: Annotated[
        Path, typer.Argument(help="Output folder of `vidforge clip` (its manifest.jsonl and clips/).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (created; a rerun resumes it).")],
    limit: Annotated[
        int | None, typer.Option("--limit", help="Annotate only the first N clips.", min=1)
    ] = None,
    executor: Annotated[
        str, typer.Option("--executor", help="local (a decode process pool and one model thread) or ray.")
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Ray cluster to join; default: start a local Ray instance."),
    ] = None,
    retry_errors: Annotated[
        bool,
        typer.Option("--retry-errors", help="Redo the clips an earlier run recorded in errors.jsonl."),
    ] = False,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Caption every clip (CoCa, a VLM endpoint or source sidecars) and record aesthetic, on-screen text,
    motion and caption-video match; each clip ends with keep true/false and its reasons.

    Writes OUT/manifest.jsonl, rejected.jsonl, errors.jsonl, summary.json, histograms.png and clips/.
    A rerun skips finished clips (add --retry-errors to redo failed ones). Exit codes: 0 all clips
    annotated, 3 some failed (see OUT/errors.jsonl), 2 fix your input (refused before any model loads).

    Captions that came with the videos (--set curation.caption.backend=sidecar): a CSV with a header row
    `path,caption` and optional `start,end` in seconds (a path relative to the CSV's folder, or a file
    name), given as curation.caption.sidecar.path; or, without it, `<video>.captions.json` beside each
    source video holding [{"start": 0.0, "end": 4.0, "text": "..."}]. A segment captions the clips it
    covers for at least curation.caption.sidecar.min_overlap of their length.

    Example: vidforge caption runs/clips -o runs/captioned --executor ray --set curation.caption.backend=endpoint
    Example: vidforge caption runs/clips -o runs/captioned --set curation.caption.backend=sidecar --set curation.caption.sidecar.path=captions.csv
    """
    from vidforge.curate.caption import run

    resolved = profile_from(profile, set_)
    output = current_output()
    bars = StageBars(current_output()) if output.show_progress else None

    def started(info: dict) -> None:
        output.info(
            f"{info['clips']} clip(s), {info['clips'] - info['todo']} already done"
            + (f", {info['retried']} to retry" if info["retried"] else "")
        )
        output.progress("clip", info["clips"] - info["todo"], info["clips"], **info)
        if bars is not None and info["todo"]:
            bars.start({name: info["todo"] for name in info["stages"]})  # every clip passes every stage

    try:
        summary = run(
            resolved,
            clips_dir,
            out,
            limit=limit,
            executor=executor,
            ray_address=ray_address,
            retry_errors=retry_errors,
            progress=None if bars else lambda done, total: output.progress("clip", done, total),
            monitor=bars.update if bars else None,
            on_start=started,
        )
    finally:
        if bars is not None:
            bars.stop()
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
        if summary.stages:
            output.table(
                [
                    (s["stage"], s["items"], s["errors"], s["workers"], s["busy_seconds"])
                    for s in summary.stages
                ],
                columns=("stage", "items", "errors", "workers", "busy s"),
            )
        output.note_random_weights(summary.random_weights, "give each model's weights in the profile")
        retried = f", {summary.retried} retried" if summary.retried else ""
        output.result(
            {},
            text=f"{summary.kept} kept, {summary.rejected} rejected, {summary.errors} errors of "
            f"{summary.clips} clips ({summary.skipped} already done{retried}) -> {summary.out}",
        )
        if summary.rejected:
            output.info(f"rejected clips and their reasons: {out / 'rejected.jsonl'}")
    if summary.errors:
        output.info(f"[yellow]{summary.errors} error(s)[/]: see {out / 'errors.jsonl'}")
        raise typer.Exit(EXIT_PARTIAL)
