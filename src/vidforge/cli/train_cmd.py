"""`vidforge train --data LATENTS --run-dir RUN`: train the profile's DiT on latent shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import (
    NprocOpt,
    ProfileOpt,
    SetOpt,
    names_from_the_registry,
    parse_sets,
    profile_from,
)
from vidforge.cli._output import current_output
from vidforge.profile.overrides import Override, as_overrides


@names_from_the_registry
def train(
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            "-d",
            help="Latent shards (`vidforge tokenize` output): a folder or an fsspec URL (s3://bucket/prefix); "
            "repeatable.",
        ),
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", "-r", help="Checkpoints, metrics.jsonl, export/ go here.")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest complete checkpoint.")
    ] = False,
    reschedule: Annotated[
        bool,
        typer.Option(
            "--reschedule",
            help="With --resume: fit the profile's learning-rate schedule (train.steps, lr, warm-up) from the "
            "resumed step; without it a resumed run keeps the schedule it was trained with.",
        ),
    ] = False,
    init: Annotated[
        Path | None,
        typer.Option(
            "--init",
            help="Start from these weights (a vidforge export, a diffusers transformer or pipeline folder, a "
            "training checkpoint or a run directory: its latest, EMA weights); a new optimizer, step 0.",
        ),
    ] = None,
    allow_partial: Annotated[
        bool,
        typer.Option(
            "--allow-partial", help="With --init: start tensors the weights lack (or shape otherwise) fresh."
        ),
    ] = False,
    init_raw: Annotated[
        bool,
        typer.Option("--init-raw", help="With --init CHECKPOINT: its raw weights rather than their EMA."),
    ] = False,
    nproc: NprocOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Build the profile's whole layout in this one process on a fake process group (no GPUs, "
            "no data) and print each pipeline stage's per-rank memory; then exit.",
        ),
    ] = False,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Train on the profile's objective (diffusion.objective: {objectives}): AdamW, warm-up +
    cosine, bf16, EMA, FSDP2 across processes, sharded checkpoints (resumable), metrics to the console,
    RUN/metrics.jsonl and TensorBoard.

    A profile with `stages:` (a curriculum) trains them in order, each in RUN/stages/NN-NAME and started
    from the previous stage's EMA weights; --resume continues inside the stage it stopped in.

    Example: vidforge train --data runs/latents --run-dir runs/train --set train.steps=500
    Example: vidforge train --data runs/latents --run-dir runs/finetune --init runs/train/export
    Example: vidforge train --data runs/wan_latents --run-dir runs/wan_lora --init /models/Wan2.1-T2V-1.3B-Diffusers --profile dit1b_1xh200 --set train.lora.rank=32 --set train.lora.alpha=32 (a published folder gives the model, flow objective, VAE and umT5; --resume needs the same --init)
    Example: vidforge train --data runs/latents --run-dir runs/train --nproc 2
    Example: vidforge train --dry-run --profile dit28b_74k_tp4_cp8_256xh100
    Example: vidforge train --run-dir runs/curriculum --profile wan14b_curriculum_128xh200 --init WAN_DIR
    """
    from vidforge.errors import UserInputError
    from vidforge.parallel.launch import start_ranks

    sets = [*parse_sets(set_), *(as_overrides({"train.resume_schedule": "refit"}) if reschedule else [])]
    resolved = _init_profile(init, profile, sets, nproc, allow_partial) if init is not None else None
    if resolved is None:
        resolved = profile_from(profile, sets, nproc)
    if dry_run:
        _dry_run(resolved)
        return
    sourced = bool(resolved.data.sources) or (bool(resolved.stages) and all(s.data for s in resolved.stages))
    if (not data and not sourced) or run_dir is None:
        raise UserInputError("train needs --data LATENTS and --run-dir RUN (or --dry-run to check a layout)")
    code = start_ranks(nproc)
    if code is not None:
        raise typer.Exit(code)

    from vidforge.train import curriculum
    from vidforge.train.loop import run, summary_dict

    output = current_output()

    total = curriculum.total_steps(resolved)
    steps = {s.name: s.steps for s in resolved.stages}

    def show(record: dict) -> None:
        of = steps.get(record.get("stage"), total)
        if output.json:
            output.progress("step", record["step"], of, **record)
        else:
            stage = f"stage {record['stage']}  " if "stage" in record else ""
            output.info(
                f"{stage}step {record['step']:>6}/{of}  loss {record['loss']:.4f}  grad {record['grad_norm']:.3g}  "
                f"lr {record['lr']:.2e}  {record['tokens_per_s']:.0f} tok/s  {record['step_time_s'] * 1000:.0f} ms/step  "
                f"data wait {record['data_wait_s'] * 1000:.0f} ms  MFU {record['mfu']:.1%}"
            )

    from vidforge.train.init_weights import WeightsInit

    weights = WeightsInit(init, allow_partial, init_raw) if init is not None else None
    train = curriculum.run if resolved.stages else run
    with output.step_bar("train", total) as on_step:
        summary = train(
            resolved,
            data or [],
            run_dir,
            resume=resume,
            progress=show,
            init=weights,
            on_step=on_step,
            notice=output.info,
        )
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one summary, from rank 0 (the CLI boundary leaves the process group on the way out)
    result = summary_dict(summary)
    if output.json or not resolved.stages:
        output.result(result, title="vidforge train")
        return
    rows = {k: v for k, v in result.items() if k != "stages"}
    for s in result["stages"]:  # one row a stage: a table cell cannot hold a whole summary
        done = "complete before --resume" if s["skipped"] else f"steps {s['start_step']}->{s['last_step']}"
        loss = s["final_loss_mean"]
        rows[f"stage {s['stage']}"] = done + (f", final loss {loss:.4f}" if loss is not None else "")
    output.result(rows, title="vidforge train")


def _init_profile(init: Path, profile, sets: list[Override], nproc, allow_partial: bool):
    """The profile of a published --init folder (its model section, objective, VAE and text encoder
    under the user's profile and --set); None for an export or a checkpoint, whose model the profile
    gives."""
    from vidforge.parallel.launch import nproc_overrides
    from vidforge.weights.weights_folder import find_weights, published_profile

    found = find_weights(init) if not (init / "checkpoints").is_dir() else None
    if found is None or found.published is None:
        return None
    return published_profile(found.published, [*sets, *nproc_overrides(nproc)], profile, not allow_partial)


def _dry_run(profile) -> None:
    from vidforge.train.dry_run import dry_run

    result = dry_run(profile)
    gib = 2.0**30
    lines = [f"{result.profile}: {result.layout}, {result.world_size} ranks (built on a fake process group)"]
    for s in result.stages:
        first, last = (s.blocks[0], s.blocks[-1]) if s.blocks else (None, None)
        lines += [
            f"  pipeline stage {s.stage} (e.g. rank {s.rank}), blocks {first}..{last}: "
            f"{s.parameters:,} parameters per rank",
            f"    parameters {s.parameter_bytes / gib:8.2f} GiB   gradients {s.gradient_bytes / gib:8.2f} GiB   "
            f"AdamW {s.optimizer_bytes / gib:8.2f} GiB   EMA {s.ema_bytes / gib:8.2f} GiB",
            "    model: "
            + "   ".join(f"{name} {v / gib:.2f} GiB" for name, v in s.model_terms.items())
            + f"   total {s.total_bytes / gib:.2f} GiB   (the memory model's parameters: "
            f"{s.model_parameter_bytes / gib:.2f} GiB)",
        ]
        if s.host_bytes:
            lines.append(
                f"    host memory (block swap): {s.host_bytes / gib:.2f} GiB of frozen weights (under FSDP2 with "
                "the swapped blocks' adapters and their optimizer states)"
            )
        if s.offloaded_bytes:
            lines.append(
                f"    host memory (activation and checkpoint offload): {s.offloaded_bytes / gib:.2f} GiB of "
                "saved tensors (the memory model's)"
            )
    lines += [f"  {note}" for note in result.notes]
    current_output().result(result.as_dict(), text="\n".join(lines))
