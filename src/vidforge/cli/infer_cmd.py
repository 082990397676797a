"""`vidforge infer --checkpoint RUN --prompt TEXT -o OUT`: sample videos from a trained model."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import SetOpt
from vidforge.cli._output import current_output
from vidforge.errors import UserInputError


def infer(
    checkpoint: Annotated[
        Path, typer.Option("--checkpoint", "-c", help="A `vidforge train` run dir or its export/.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for the MP4s, contact_sheet.png, samples.jsonl.")
    ],
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", help="A caption to render; repeatable.")
    ] = None,
    prompts_file: Annotated[
        Path | None, typer.Option("--prompts-file", help="A text file with one prompt per line.")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", "-p", help="Profile to use instead of the one saved with the model."),
    ] = None,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            min=1,
            help="Share the sampling over this many local processes under torchrun (CFG-parallel, sequence parallel).",
        ),
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Sample videos: text encoder -> sampler (diffusion.sampler heun|res, steps, guidance) -> DiT ->
    tokenizer decode -> H.264 MP4 and a PNG contact sheet. The same seed and prompt give the same video.

    Example: vidforge infer -c runs/train --prompt "a red square moving right" -o runs/samples
    Example: vidforge infer -c runs/train --prompts-file prompts.txt -o out --set diffusion.sampler=res --set infer.seed=7
    Example: vidforge infer -c runs/train --prompt "a red square moving right" -o out --nproc 2

    With --nproc N the ranks share every batch: with guidance and an even N, the conditional and
    unconditional branches run on two halves (CFG-parallel); the ranks of each half split the token
    sequence (ST-DiT: ScaleFusion's overlapped all-to-alls; DiT: context-parallel denoising). Rank 0
    writes the videos.
    """
    from vidforge.parallel.launch import is_rank_zero, start_ranks

    code = start_ranks(nproc)
    if code is not None:
        raise typer.Exit(code)

    from vidforge.infer.run import run

    prompts = list(prompt or [])
    if prompts_file is not None:
        if not prompts_file.is_file():
            raise UserInputError(f"--prompts-file {prompts_file}: no such file")
        prompts += [line.strip() for line in prompts_file.read_text().splitlines() if line.strip()]
    output = current_output()
    what = f"sampling {len(prompts)} prompt(s) from {checkpoint}: loading the model, then denoising"
    with output.working(what) if is_rank_zero() else nullcontext():
        result = run(checkpoint, prompts, out, overrides=set_ or (), profile=profile, log=output.info)
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one summary, from rank 0 (the CLI boundary leaves the process group on the way out)
    if output.json:
        output.result(
            {"videos": result.videos, "contact_sheet": result.contact_sheet, "seconds": result.seconds}
        )
    else:
        output.table(
            [(Path(v).name,) for v in result.videos], columns=("video",), title=f"vidforge infer -> {out}"
        )
        output.result(
            {}, text=f"contact sheet: {result.contact_sheet}  ({result.seconds_per_video:.1f} s per video)"
        )
