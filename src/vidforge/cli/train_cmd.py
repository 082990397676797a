"""`vidforge train --data LATENTS --run-dir RUN`: train the profile's DiT on latent shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import NprocOpt, ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import current_output


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
    init: Annotated[
        Path | None,
        typer.Option(
            "--init",
            help="Start from these weights (a vidforge export, a diffusers transformer or pipeline folder); "
            "a new optimizer, step 0.",
        ),
    ] = None,
    allow_partial: Annotated[
        bool,
        typer.Option(
            "--allow-partial", help="With --init: start tensors the weights lack (or shape otherwise) fresh."
        ),
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
    """Train with the EDM loss: AdamW, warm-up + cosine, bf16, EMA, FSDP2 across processes, sharded
    checkpoints (resumable), metrics to the console, RUN/metrics.jsonl and TensorBoard.

    Example: vidforge train --data runs/latents --run-dir runs/train --set train.steps=500
    Example: vidforge train --data runs/latents --run-dir runs/finetune --init runs/train/export
    Example: vidforge train --data runs/latents --run-dir runs/train --nproc 2
    Example: vidforge train --dry-run --profile dit28b_74k_tp4_cp8_256xh100
    """
    from vidforge.errors import UserInputError
    from vidforge.parallel.launch import start_ranks

    resolved = profile_from(profile, set_, nproc)
    if dry_run:
        _dry_run(resolved)
        return
    if not data or run_dir is None:
        raise UserInputError("train needs --data LATENTS and --run-dir RUN (or --dry-run to check a layout)")
    code = start_ranks(nproc)
    if code is not None:
        raise typer.Exit(code)

    from vidforge.train.loop import run, summary_dict

    output = current_output()

    total = resolved.train.steps

    def show(record: dict) -> None:
        if output.json:
            output.progress("step", record["step"], total, **record)
        else:
            output.info(
                f"step {record['step']:>6}/{total}  loss {record['loss']:.4f}  grad {record['grad_norm']:.3g}  "
                f"lr {record['lr']:.2e}  {record['tokens_per_s']:.0f} tok/s  {record['step_time_s'] * 1000:.0f} ms/step  "
                f"data wait {record['data_wait_s'] * 1000:.0f} ms  MFU {record['mfu']:.1%}"
            )

    from vidforge.train.init_weights import WeightsInit

    weights = WeightsInit(init, allow_partial) if init is not None else None
    with output.step_bar("train", total) as on_step:
        summary = run(resolved, data, run_dir, resume=resume, progress=show, init=weights, on_step=on_step)
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one summary, from rank 0 (the CLI boundary leaves the process group on the way out)
    output.result(summary_dict(summary), title="vidforge train")


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
            f"    activations {s.activation_bytes / gib:7.2f} GiB (model)   total {s.total_bytes / gib:8.2f} GiB   "
            f"(the memory model's parameters: {s.model_parameter_bytes / gib:.2f} GiB)",
        ]
    lines += [f"  {note}" for note in result.notes]
    current_output().result(result.as_dict(), text="\n".join(lines))
