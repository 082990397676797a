"""`vidforge infer --checkpoint RUN --prompt TEXT -o OUT`: sample videos from a trained model."""

from __future__ import annotations

from contextlib import nullcontext
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from vidforge import sampler_registry
from vidforge.cli._options import SetOpt, names_from_the_registry, parse_sets
from vidforge.cli._output import current_output
from vidforge.errors import UserInputError
from vidforge.files import read_text
from vidforge.profile.overrides import as_overrides

# The choices --help lists are the registry's (diffusion.sampler's), not a second list.
Sampler = Enum("Sampler", {name: name for name in sampler_registry.SAMPLER_NAMES}, type=str)


CheckpointOpt = Annotated[
    Path, typer.Option("--checkpoint", "-c", help="A `vidforge train` run dir or its export/.")
]

OutOpt = Annotated[
    Path, typer.Option("--out", "-o", help="Folder for the MP4s, contact_sheet.png, samples.jsonl.")
]

PromptOpt = Annotated[list[str] | None, typer.Option("--prompt", help="A caption to render; repeatable.")]

PromptsFileOpt = Annotated[
    Path | None, typer.Option("--prompts-file", help="A text file with one prompt per line.")
]

InferProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", "-p", help="Profile to use instead of the one saved with the model."),
]

NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        min=1,
        help="Share the sampling over this many local processes under torchrun (--tp, CFG-parallel, "
        "context parallel with parallel.cp_impl).",
    ),
]

TpOpt = Annotated[
    int | None,
    typer.Option(
        "--tp",
        min=1,
        help="With --nproc: hold the model tensor-parallel on groups of this many ranks, for a model "
        "that does not fit one GPU (infer.tp; must divide --nproc).",
        show_default=False,
    ),
]

StepsOpt = Annotated[
    int | None,
    typer.Option("--steps", min=1, help="Sampler steps (diffusion.steps).", show_default=False),
]

GuidanceOpt = Annotated[
    float | None,
    typer.Option(
        "--guidance",
        min=0.0,
        help="Classifier-free guidance scale; 1 turns it off (diffusion.guidance).",
        show_default=False,
    ),
]

SeedOpt = Annotated[
    int | None,
    typer.Option("--seed", help="Seed of the first prompt's noise (infer.seed).", show_default=False),
]

NegativePromptOpt = Annotated[
    str | None,
    typer.Option(
        "--negative-prompt",
        help="What the guidance steers away from. Profile field: infer.negative_prompt",
        show_default=False,
    ),
]

SamplerOpt = Annotated[
    Sampler | None, typer.Option("--sampler", help="diffusion.sampler.", show_default=False)
]

HeightOpt = Annotated[
    int | None, typer.Option("--height", min=8, help="infer.height in pixels.", show_default=False)
]

WidthOpt = Annotated[
    int | None, typer.Option("--width", min=8, help="infer.width in pixels.", show_default=False)
]

FramesOpt = Annotated[int | None, typer.Option("--frames", min=1, help="infer.frames.", show_default=False)]

LoraOpt = Annotated[
    Path | None,
    typer.Option("--lora", help="A LoRA run (train.lora) or its export/: its adapter on the -c base."),
]

LoraScaleOpt = Annotated[
    float, typer.Option("--lora-scale", help="With --lora: the adapter's weight (0: the base alone).")
]

ImageOpt = Annotated[
    Path | None,
    typer.Option(
        "--image",
        help="Start every video from this image (image-to-video: a model with model.expand_timesteps, "
        "e.g. Wan2.2 TI2V, or with model.condition_channels, Wan2.1-I2V). Without it, text-to-video.",
    ),
]


@names_from_the_registry
def infer(
    checkpoint: CheckpointOpt,
    out: OutOpt,
    prompt: PromptOpt = None,
    prompts_file: PromptsFileOpt = None,
    profile: InferProfileOpt = None,
    nproc: NprocOpt = None,
    tp: TpOpt = None,
    steps: StepsOpt = None,
    guidance: GuidanceOpt = None,
    seed: SeedOpt = None,
    negative_prompt: NegativePromptOpt = None,
    sampler: SamplerOpt = None,
    height: HeightOpt = None,
    width: WidthOpt = None,
    frames: FramesOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 1.0,
    image: ImageOpt = None,
    set_: SetOpt = None,
) -> None:
    """Sample videos: text encoder -> the objective's sampler (diffusion.sampler: {samplers};
    steps, guidance) -> the model (DiT, ST-DiT or Wan) ->
    tokenizer decode -> H.264 MP4 and a PNG contact sheet. The same seed and prompt give the same video.

    Example: vidforge infer -c runs/train --prompt "a red square moving right" -o runs/samples
    Example: vidforge infer -c runs/train --prompts-file prompts.txt -o out --set diffusion.sampler=res --set infer.seed=7
    Example: vidforge infer -c runs/train --prompt "a red square moving right" -o out --nproc 2
    Example: vidforge infer -c Wan2.1-T2V-1.3B-Diffusers --lora runs/wan_lora --lora-scale 0.8 --prompt "a cat" -o out
    Example: vidforge infer -c Wan2.2-TI2V-5B-Diffusers --image first.png --prompt "the cat walks away" -o out
    Example: vidforge infer -c Wan2.1-I2V-14B-480P-Diffusers --image first.png --prompt "the cat turns its head" -o out
    Example: vidforge infer -c runs/train --prompt "a red square" -o out --steps 50 --guidance 7 --seed 3 --negative-prompt "blurry" --sampler res --height 64 --width 96 --frames 17

    The flags are the profile fields named in their help (the flag wins over a --set of the same field).

    With --nproc N the ranks share every batch: with --tp T (infer.tp) groups of T ranks hold the model
    tensor-parallel (training's TP plan); with guidance and an even number of groups, the conditional and
    unconditional branches run on two halves (CFG-parallel); the ranks of each half split the token
    sequence (ST-DiT: ScaleFusion's overlapped all-to-alls, or st-hybrid for the parallel block; DiT and
    Wan: context parallel with the profile's parallel.cp_impl: all-gather, ring, ulysses or usp). Rank 0
    writes the videos. A layout the model cannot take (tp not dividing the heads, Ulysses over more ranks
    than heads, ...) is refused in one line before sampling.

    Example: vidforge infer -c runs/train --prompt "a cat" -o out --nproc 4 --tp 2   # TP2 x CFG-parallel
    Example: vidforge infer -c runs/train --prompt "a cat" -o out --nproc 4 --guidance 1 --set parallel.cp_impl=ring
    """
    from vidforge.parallel.launch import is_rank_zero, start_ranks

    code = start_ranks(nproc)
    if code is not None:
        raise typer.Exit(code)

    from vidforge.infer.run import run

    prompts = _prompts(prompt, prompts_file)
    flags = {
        "diffusion.steps": steps,
        "diffusion.guidance": guidance,
        "diffusion.sampler": sampler.value if sampler else None,
        "infer.seed": seed,
        "infer.negative_prompt": negative_prompt,
        "infer.height": height,
        "infer.width": width,
        "infer.frames": frames,
        "infer.tp": tp,
    }
    overrides = [*parse_sets(set_), *as_overrides({k: v for k, v in flags.items() if v is not None})]
    output = current_output()
    what = f"sampling {len(prompts)} prompt(s) from {checkpoint}: loading the model, then denoising"
    with output.working(what) if is_rank_zero() else nullcontext():
        result = run(
            checkpoint,
            prompts,
            out,
            overrides=overrides,
            profile=profile,
            log=output.info,
            lora=lora,
            lora_scale=lora_scale,
            image=image,
        )
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one summary, from rank 0 (the CLI boundary leaves the process group on the way out)
    _report(result, out)


def _prompts(prompt: list[str] | None, prompts_file: Path | None) -> list[str]:
    """The --prompt captions, then --prompts-file's lines (blank ones left out)."""
    prompts = list(prompt or [])
    if prompts_file is not None:
        if not prompts_file.is_file():
            raise UserInputError(f"--prompts-file {prompts_file}: no such file")
        text = read_text(prompts_file, "--prompts-file")
        prompts += [line.strip() for line in text.splitlines() if line.strip()]
    return prompts


def _report(result, out: Path) -> None:
    """The run's summary: its videos and contact sheet (and what step caching skipped)."""
    output = current_output()
    if output.json:
        output.result(
            {
                "videos": result.videos,
                "contact_sheet": result.contact_sheet,
                "seconds": result.seconds,
                "model_calls": result.model_calls,
                "skipped_calls": result.skipped_calls,
            }
        )
        return
    output.table(
        [(Path(v).name,) for v in result.videos], columns=("video",), title=f"vidforge infer -> {out}"
    )
    calls = ""
    if result.skipped_calls:  # step caching (infer.cache) skipped some
        calls = f", {result.skipped_calls} of {result.model_calls} model calls skipped by infer.cache"
    output.result(
        {},
        text=f"contact sheet: {result.contact_sheet}  ({result.seconds_per_video:.1f} s per video{calls})",
    )
