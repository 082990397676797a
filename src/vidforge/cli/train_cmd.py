"""`vidforge train --data LATENTS --run-dir RUN`: train the profile's DiT on latent shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import current_output


def train(
    data: Annotated[
        list[Path],
        typer.Option("--data", "-d", help="Latent shards (`vidforge tokenize` output); repeatable."),
    ],
    run_dir: Annotated[
        Path, typer.Option("--run-dir", "-r", help="Checkpoints, metrics.jsonl, export/ go here.")
    ],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest complete checkpoint.")
    ] = False,
    nproc: Annotated[
        int | None, typer.Option("--nproc", min=1, help="Start this many local processes under torchrun.")
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Train with the EDM loss: AdamW, warm-up + cosine, bf16, EMA, FSDP2 across processes, sharded
    checkpoints (resumable), metrics to the console, RUN/metrics.jsonl and TensorBoard.

    Example: vidforge train --data runs/latents --run-dir runs/train --set train.steps=500
    Example: vidforge train --data runs/latents --run-dir runs/train --nproc 2 --set cluster.cpu_processes=2
    """
    from vidforge.parallel.launch import relaunch_under_torchrun, slurm_to_torch_env, under_launcher

    resolved = profile_from(profile, set_)
    if nproc is not None and not under_launcher():
        if nproc != resolved.layout.world_size:
            from vidforge.errors import UserInputError

            raise UserInputError(
                f"--nproc {nproc}: the profile's layout needs {resolved.layout.world_size} rank(s); "
                f"set cluster.cpu_processes (or gpus_per_node) to {nproc}, or change --nproc"
            )
        raise typer.Exit(relaunch_under_torchrun(nproc))
    slurm_to_torch_env()

    from vidforge.train.loop import run, summary_dict

    output = current_output()

    def show(record: dict) -> None:
        if output.json:
            output.event("metrics", **record)
        else:
            output.info(
                f"step {record['step']:>6}  loss {record['loss']:.4f}  grad {record['grad_norm']:.3g}  "
                f"lr {record['lr']:.2e}  {record['tokens_per_s']:.0f} tok/s  {record['step_time_s'] * 1000:.0f} ms/step  "
                f"MFU {record['mfu']:.1%}"
            )

    summary = run(resolved, data, run_dir, resume=resume, progress=show)
    import torch.distributed as dist

    if dist.is_initialized():
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank != 0:
            return
    output.result(summary_dict(summary), title="vidforge train")
