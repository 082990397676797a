"""`vidforge finetune VIDEOS_DIR --base BASE -o RUN`: captioned videos and a base model to a fine-tune
(calls vidforge.finetune.run, which calls each stage's own function)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from vidforge.cli._options import NprocOpt, ProfileOpt, SetOpt, parse_sets
from vidforge.cli._output import Output, StageBars, current_output
from vidforge.finetune import Hooks


class _Shown(Hooks):
    """Each stage's command line, then the progress its own command shows."""

    def __init__(self, output: Output):
        self.output = output
        self.started = 0

    def stage(self, name: str, command: str, skipped: bool) -> None:
        self.started += 1
        self.output.progress("stage", self.started, None, stage=name, command_line=command, skipped=skipped)
        state = "done before, passed over" if skipped else "running"
        self.output.info(f"[bold]{name}[/] ({state}): {command}")

    def notice(self, line: str) -> None:
        self.output.info(line)

    @contextmanager
    def progress(self, name: str, total: int | None = None) -> Iterator[dict[str, Any]]:
        out = self.output
        if name in ("clip", "caption"):
            bars = StageBars(out) if out.show_progress else None

            def started(info: dict[str, Any]) -> None:
                total = info.get("sources", info.get("clips"))
                out.progress("source" if name == "clip" else "clip", total - info["todo"], total)
                if bars is not None and info["todo"]:
                    bars.start({stage: info["todo"] for stage in info["stages"]})

            try:
                yield {"monitor": bars.update if bars else None, "on_start": started}
            finally:
                if bars is not None:
                    bars.stop()
        elif name == "shard":
            with out.shard_progress(name) as on_shard:
                yield {"on_shard": on_shard}
        elif name == "tokenize":  # a fine-tune's clips are in one or two shards: count the clips
            with out.shard_progress(name, bar=False) as on_shard, out.sample_progress(name) as on_sample:
                yield {"on_shard": on_shard, "on_sample": on_sample}
        elif name == "train":

            def show(record: dict[str, Any]) -> None:
                out.progress("step", record["step"], total, **record)
                out.info(
                    f"step {record['step']:>6}/{total}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
                    f"{record['step_time_s'] * 1000:.0f} ms/step"
                )

            with out.step_bar("train", total or 0) as on_step:
                yield {"progress": show, "on_step": on_step}
        elif name == "review" and out.show_progress:
            with out.shard_progress("thumbnails") as advance:
                yield {"progress": lambda done, total: advance({}, total)}
        else:
            yield {}


def finetune(
    videos: Annotated[
        Path,
        typer.Argument(
            help="A folder of videos, each with its caption: VIDEO.txt beside it, or one captions table "
            "(CSV with a header, or JSONL: path|file_name|video|video_path and caption|text|prompt)."
        ),
    ],
    base: Annotated[
        Path,
        typer.Option(
            "--base",
            "-b",
            help="The model to fine-tune: a diffusers Wan2.1 folder (its transformer, VAE and umT5 are used) "
            "or a vidforge run or export.",
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Run folder: every stage's output (a rerun resumes it).")
    ] = Path("runs/finetune"),
    captions: Annotated[
        Path | None,
        typer.Option("--captions", help="A CSV or JSONL of path,caption (default: the one in VIDEOS)."),
    ] = None,
    full: Annotated[
        bool, typer.Option("--full", help="Train every weight instead of a LoRA (lr 1e-5).")
    ] = False,
    cut: Annotated[
        bool,
        typer.Option(
            "--cut",
            help="Cut the videos into shots (`vidforge clip`'s detector and filters) instead of taking each "
            "whole.",
        ),
    ] = False,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Training steps (train.steps).")] = None,
    prompt: Annotated[
        list[str] | None,
        typer.Option(
            "--prompt",
            help="A validation prompt; repeatable (default: the first captions of the data).",
        ),
    ] = None,
    validate_every: Annotated[
        int | None,
        typer.Option(
            "--validate-every",
            min=0,
            help="Sample the prompts every N steps (default: four times over the run and at its end; 0: never).",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in -o (the default: a rerun always passes over finished stages and resumes "
            "training; accepted as `train` takes it).",
        ),
    ] = False,
    reschedule: Annotated[
        bool,
        typer.Option(
            "--reschedule",
            help="On resuming with a changed --steps or lr settings, fit the new schedule from the resumed "
            "step (train --reschedule) instead of keeping the saved one.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Check everything that could refuse the run (device, buckets, short videos, validation size, "
            "memory fit), print the resolved settings and the stages it would run; run none, write nothing.",
        ),
    ] = False,
    nproc: NprocOpt = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Fine-tune BASE on a folder of captioned videos in one command: clip (each video whole, or --cut into
    shots), caption from the captions given, shard with the base model's text encoder, tokenize with its
    VAE, train a LoRA (or --full) with validation videos, export, and a review page. Each stage prints the
    command that runs it alone; the memory model checks the training step fits before anything runs.

    Writes RUN/profile.yaml, RUN/captions.csv, RUN/clips, RUN/captioned, RUN/shards, RUN/latents, RUN/train
    (checkpoints, metrics, validation/, tensorboard/, export/: a LoRA in diffusers' format) and, for a full
    fine-tune of a diffusers model, RUN/diffusers/transformer. Rerun the same command to resume: finished
    stages are passed over and training continues from its latest checkpoint.

    Example: vidforge finetune clips/ --base /models/Wan2.1-T2V-1.3B-Diffusers -o runs/my_lora --profile dit1b_1xh200 --set data.buckets=[[480,832]] --set data.frame_buckets=[49] --steps 2000
    Example: vidforge finetune clips/ --base runs/wan_lora_merged_vf -o runs/round2 --full --prompt "a cat on the grass"
    Example: vidforge finetune clips/ --base /models/Wan2.1-T2V-1.3B-Diffusers -o runs/my_lora --profile dit1b_1xh200 --nproc 8
    Example: vidforge finetune clips/ --base /models/Wan2.1-T2V-14B-Diffusers -o runs/wan14b --profile wan14b_4090.yaml --dry-run
    """
    from vidforge.finetune import Request, run

    output = current_output()
    request = Request(
        videos=videos,
        base=base,
        out=out,
        captions=captions,
        full=full,
        cut=cut,
        steps=steps,
        prompts=tuple(prompt or ()),
        validate_every=validate_every,
        profile=profile,
        overrides=tuple(parse_sets(set_)),
        nproc=nproc,
        reschedule=reschedule,
        dry_run=dry_run,
    )
    del resume  # every run resumes
    summary = run(request, _Shown(output))
    data = summary.as_dict()
    if dry_run:
        output.result(data, text=_dry_run_text(summary))
        return
    lines = [f"vidforge finetune -> {summary.out}"]
    lines += [f"  model: {summary.model}"] if summary.model else []
    lines += [f"  validation videos: {summary.validation}"] if summary.validation else []
    lines += [f"  review page: {summary.review}"] if summary.review else []
    lines += ["  next:", *(f"    {line}" for line in summary.next)] if summary.next else []
    output.result(data, text="\n".join(lines))


def _dry_run_text(summary) -> str:
    plan = summary.plan
    memory = plan["memory_gib"]
    lines = [f"vidforge finetune --dry-run -> {summary.out} (nothing run, nothing written)"]
    lines += [f"  {key}: {value}" for key, value in plan.items() if value is not None and key != "memory_gib"]
    if memory is not None:
        lines.append(
            f"  memory: {memory} GiB of {plan['memory_limit_gib']} GiB a card at {plan['clip']}: fits"
        )
    lines.append("  stages it would run:")
    lines += [f"    {s.name}{' (done before)' if s.skipped else ''}: {s.command}" for s in summary.stages]
    return "\n".join(lines)
