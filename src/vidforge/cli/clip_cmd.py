"""`vidforge clip INPUT... -o OUT`: raw videos to clips (calls vidforge.curate.clip.run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import EXIT_PARTIAL, StageBars, current_output
from vidforge.cli._startup import collector_paused


def clip(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="Video files, directories, glob patterns, list files (.txt/.csv) or fsspec URLs.",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (clips/, manifest.jsonl, ...).")],
    executor: Annotated[str, typer.Option("--executor", help="local (process pools) or ray.")] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Ray cluster to join; default: start a local Ray instance."),
    ] = None,
    dedup: Annotated[
        float | None,
        typer.Option(
            "--dedup",
            metavar="THRESHOLD",
            help="Drop clips whose embedding cosine with an earlier clip is at least this.",
        ),
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Cut raw videos into clean clips: shot detection, stitching, duration and static filters,
    frame-accurate H.264 transcode and clip embeddings. Reruns skip finished sources.

    Example: vidforge clip raw/ -o curated/ --set curation.max_seconds=10 --dedup 0.95

    Exit codes: 0 all sources processed, 3 some failed (see OUT/errors.jsonl), 2 fix your input.
    """
    with collector_paused():  # numpy, PyAV, cv2, PySceneDetect: start-up, before the first frame
        from vidforge.curate.clip import run

    out_ = current_output()
    resolved = profile_from(profile, set_)
    progress = StageBars(current_output()) if out_.show_progress else None

    def started(info: dict) -> None:
        if info["embedder"] and "random weights" in info["embedder"]:
            out_.note_random_weights(
                [f"embeddings ({resolved.curation.embed_model})"], "set curation.embed_checkpoint"
            )
        if info.get("random_shot_detector"):
            out_.note_random_weights(["shot detector (transnetv2)"], "set curation.transnetv2_weights")
        if info.get("decode_fallback"):
            out_.info(info["decode_fallback"])
        out_.info(f"{info['sources']} source(s), {info['sources'] - info['todo']} already done")
        out_.progress("source", info["sources"] - info["todo"], info["sources"], **info)
        if progress is not None:
            progress.start({name: info["todo"] if name == "decode" else None for name in info["stages"]})

    try:
        result = run(
            resolved,
            inputs,
            out,
            executor=executor,
            ray_address=ray_address,
            dedup=dedup,
            monitor=progress.update if progress else None,
            on_start=started,
        )
    finally:
        if progress is not None:
            progress.stop()
    summary = result.summary
    if result.stages:
        out_.table(
            [
                (s["stage"], s["items"], s["errors"], s["workers"], s["busy_seconds"])
                for s in summary["stages"]
            ],
            columns=("stage", "items", "errors", "workers", "busy s"),
        )
    out_.result({k: v for k, v in summary.items() if k != "stages"} | {"out": str(out)}, title="clip")
    if summary.get("rejected"):
        out_.info(
            f"{sum(summary['rejected'].values())} clip(s) rejected by a filter: see {out / 'rejected.jsonl'}"
        )
    if result.partial:
        out_.info(f"[yellow]{summary['errors']} error(s)[/]: see {out / 'errors.jsonl'}")
        raise typer.Exit(EXIT_PARTIAL)
