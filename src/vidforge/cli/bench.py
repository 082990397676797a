"""`vidforge bench train|infer|attention|curate|sweep|plan`: measure a stage, or plan a layout on paper."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any

import typer

from vidforge import sampler_registry
from vidforge.cli._options import (
    NprocOpt,
    ProfileOpt,
    SetOpt,
    names_from_the_registry,
    parse_sets,
    profile_from,
)
from vidforge.cli._output import current_output
from vidforge.errors import UserInputError
from vidforge.files import write_text
from vidforge.profile.overrides import Override, as_overrides, command_line, set_args

MAX_CLIP = (1025, 4096)
"""The largest --clip planned: frames, and pixels a side (a minute at 16 fps; 4K)."""
MAX_RANKS = 1 << 16
"""The most ranks `bench plan --rank --world-size` plans (every layout of them is evaluated)."""

app = typer.Typer(
    help="Measure training, sampling, attention and curation throughput, sweep profile fields, and plan "
    "parallel layouts (memory and communication per rank).\n\n"
    "Example: vidforge bench plan --profile dit7b_74k_tp2_cp4_64xh100 --rank",
    no_args_is_help=True,
)


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


@app.command()
def train(
    nproc: NprocOpt = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            help="Also run bench.repeats steps on batches read from these latent shards (a folder or an "
            "fsspec URL, as `vidforge train --data`) through train's own loader and prefetch, and report "
            "the time each step waited for data.",
        ),
    ] = None,
) -> None:
    """Time the training step (`vidforge train`'s own build and step: FSDP2, TP/SP, CP, PP) on synthetic
    latents of bench.latent_* (train.micro_batch clips per rank, packed when data.packing):
    bench.warmup steps, then the median of bench.repeats; tokens/s, MFU against the accelerator's peak,
    peak memory (measured) beside the memory model's prediction.

    Example: vidforge bench train --set bench.latent_frames=8 --set bench.repeats=10
    Example: vidforge bench train --nproc 2
    Example: vidforge bench train --nproc 2 --set parallel.tp=2 --set parallel.dp_shard=1
    Example: vidforge bench train --data runs/latents   # + data wait on real shards (data.prefetch)
    """
    from vidforge.parallel.launch import start_ranks

    resolved = profile_from(profile, set_, nproc)
    code = start_ranks(nproc)
    if code is not None:
        raise typer.Exit(code)
    import torch.distributed as dist

    from vidforge.bench.train_bench import run

    result = run(resolved, data)  # starts this rank's runtime (device, process group)
    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one report, from rank 0 (the CLI boundary leaves the process group on the way out)
    data = result.as_dict()
    text = "\n".join(
        [
            f"bench train  {result.profile}: {result.layout} on {result.world_size} rank(s), {result.device}",
            f"  workload        {result.workload} per rank",
            f"  step time       {result.step_time_s * 1000:.1f} ms (median of {len(result.step_times_s)}, "
            f"spread {result.step_time_spread:.0%})",
            f"  tokens/s        {result.tokens_per_s:,.0f}",
            f"  MFU             {result.mfu:.2%} of {resolved.cluster.accelerator.peak_bf16_flops / 1e12:g} TFLOP/s "
            f"x {result.world_size} (model FLOPs; HFU {result.hfu:.2%} with activation recompute)",
        ]
        + (
            [
                f"  skipped         {result.skipped_attention_flops_per_step:.4g} attention FLOPs a step (sliding tiles)"
            ]
            if result.skipped_attention_flops_per_step
            else []
        )
        + [
            f"  peak memory     {result.peak_memory_gib:.4g} GiB ({result.peak_memory_method})",
            f"  predicted       {result.predicted_memory_gib:.4g} GiB (vidforge bench plan's model); "
            f"{result.predicted_measured_terms_gib:.4g} GiB of it in the terms measured",
        ]
        + (
            [
                f"  real data       {result.data}: step {result.data_step_time_s * 1000:.1f} ms, waited "
                f"{result.data_wait_s * 1000:.2f} ms for data ({result.data_wait_fraction:.2%} of the step, "
                f"data.prefetch={resolved.data.prefetch})"
            ]
            if result.data
            else []
        )
    )
    current_output().result(data, text=text)


@app.command()
@names_from_the_registry
def infer(
    nproc: NprocOpt = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    sampler: Annotated[
        list[str] | None,
        typer.Option(
            "--sampler",
            help="Time only this sampler (repeatable); default: every sampler of diffusion.objective "
            f"({sampler_registry.samplers_by_objective()}; a distilled student's few-step is not timed).",
        ),
    ] = None,
    guidance: Annotated[
        list[str] | None,
        typer.Option("--guidance", help="Time only this guidance mode (repeatable): batched, sequential."),
    ] = None,
) -> None:
    """Sampling latency per step and end to end, for each sampler of the profile's objective ({samplers}), with classifier-free guidance batched (one doubled batch) and
    sequential (two calls). infer.batch_size prompts of bench.latent_* latents, diffusion.steps steps,
    random weights; tokenizer decode not included.

    With --nproc N: N local ranks sample the way `vidforge infer --nproc N` does (infer.tp, CFG-parallel,
    context parallel with parallel.cp_impl), against one process measured first in the same run:
    latency per step, speed-up and efficiency, and the largest difference from the one process's latents.

    Example: vidforge bench infer --set diffusion.steps=8 --set infer.batch_size=1
    Example: vidforge bench infer --set diffusion.objective=flow --sampler unipc --guidance batched
    Example: vidforge bench infer --nproc 2 --set diffusion.guidance=1 --set parallel.cp_impl=ring
    Example: vidforge bench infer --nproc 4 --set infer.tp=2   # TP2 x CFG-parallel
    """
    resolved = profile_from(profile, set_)
    if nproc is not None:
        _infer_scaling(resolved, nproc)
        return
    from vidforge.bench.infer_bench import run

    result = run(resolved, sampler, guidance)
    lines = [
        f"bench infer  {result['profile']} on {result['device']} ({result['dtype']}): {result['workload']}",
        f"  samplers of the {result['objective']} objective: {', '.join(result['samplers'])}",
    ]
    lines.append(
        f"  {'sampler':<10} {'guidance':<18} {'steps':>5} {'calls':>5} {'rows':>4} {'end to end s':>12} "
        f"{'per step s':>10} {'per call s':>10}"
    )
    for r in result["rows"]:
        lines.append(
            f"  {r['sampler']:<10} {r['guidance']:<18} {r['steps']:>5} {r['model_calls']:>5} {r['rows_per_call']:>4} "
            f"{_fmt(r['end_to_end_s']):>12} {_fmt(r['per_step_s']):>10} {_fmt(r['per_model_call_s']):>10}"
        )
    current_output().result(result, text="\n".join(lines))


def _infer_scaling(resolved, nproc: int) -> None:
    from vidforge.parallel.launch import start_ranks

    code = start_ranks(nproc)
    if code is not None:
        raise typer.Exit(code)
    import torch.distributed as dist

    from vidforge.bench.infer_scaling import run

    result = run(resolved)
    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one report, from rank 0 (the CLI boundary leaves the process group on the way out)
    lines = [
        f"bench infer  {result['profile']} on {result['device']} ({result['dtype']}): {result['workload']}, "
        f"{result['sampler']} {result['steps']} steps, guidance {result['guidance_scale']:g}",
        f"  {'layout':<44} {'ranks':>5} {'per step s':>10} {'end to end s':>12} {'speed-up':>8} {'efficiency':>10}",
    ]
    for r in result["rows"]:
        lines.append(
            f"  {r['layout']:<44} {r['ranks']:>5} {_fmt(r['per_step_s']):>10} {_fmt(r['end_to_end_s']):>12} "
            f"{r['speedup']:>7.2f}x {r['efficiency']:>10.0%}"
        )
    lines.append(f"  largest difference from the one process's latents: {result['max_abs_diff']:.2g}")
    current_output().result(result, text="\n".join(lines))


@app.command()
def attention(nproc: NprocOpt = None, profile: ProfileOpt = None, set_: SetOpt = None) -> None:
    """TFLOP/s of every attention backend (sdpa, dense, flex, flash) at bench.attention_seq_lens, forward
    and forward + backward, with the model's heads and head size; unavailable backends with the reason.
    With --nproc N: context-parallel attention instead, each length split over the N ranks: ring with
    fused per-block kernels, the einsum ring, all-gather and Ulysses (the slowest rank's times).

    Example: vidforge bench attention --set "bench.attention_seq_lens=[1024,4096,16384]"
    Example: vidforge bench attention --nproc 2 --set "bench.attention_seq_lens=[2048,8192]"
    """
    from vidforge.parallel.launch import start_ranks

    resolved = profile_from(profile, set_, nproc)
    code = start_ranks(nproc)
    if code is not None:
        raise typer.Exit(code)
    import torch.distributed as dist

    from vidforge.bench.attention_bench import run

    result = run(resolved)
    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one report, from rank 0
    ranks = result["ranks"]
    first = "backend" if ranks == 1 else "cp impl"
    lines = [
        f"bench attention  {result['device']} ({result['dtype']}), {result['heads']} heads x {result['head_dim']}"
        + ("" if ranks == 1 else f", each row split over {ranks} ranks (TFLOP/s of all ranks)"),
        f"  {first:<11} {'seq':>7} {'fwd ms':>9} {'fwd TFLOP/s':>11} {'fwd+bwd ms':>10} {'fwd+bwd TFLOP/s':>15}",
    ]
    for r in result["rows"]:
        ms = [None if r[k] is None else r[k] * 1000 for k in ("forward_s", "forward_backward_s")]
        line = (
            f"  {r['backend']:<11} {r['seq_len']:>7} {_fmt(ms[0]):>9} {_fmt(r['forward_tflops']):>11} "
            f"{_fmt(ms[1]):>10} {_fmt(r['forward_backward_tflops']):>15}"
        )
        if r["skipped"]:
            line += f"  skipped: {r['skipped']}"
        lines.append(line)
    current_output().result(result, text="\n".join(lines))


@app.command()
def curate(
    inputs: Annotated[list[str], typer.Argument(help="Videos or folders of videos to clip and caption.")],
    work_dir: Annotated[
        Path | None,
        typer.Option("--work-dir", help="Keep the clip and caption outputs here (default: temporary)."),
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Throughput of every `vidforge clip` and `vidforge caption` stage on the given videos: items per
    busy second, source frames and seconds of video per second, and each command's wall clock.

    Example: python examples/make_sample_videos.py runs/samples && vidforge bench curate runs/samples
    """
    from vidforge.bench.curate_bench import run

    result = run(profile_from(profile, set_), inputs, work_dir)
    lines = [
        f"bench curate  {result['videos']} video(s), {result['source_frames']} frames, "
        f"{result['source_seconds']} s -> {result['clips']} clips",
        f"  {'command':<8} {'stage':<30} {'items':>6} {'seconds':>8} {'items/s':>8} {'frames/s':>9} {'video s/s':>9}",
    ]
    for r in result["rows"]:
        lines.append(
            f"  {r['command']:<8} {r['stage']:<30} {r['items']:>6} {_fmt(r['seconds']):>8} {_fmt(r['items_per_s']):>8} "
            f"{_fmt(r['frames_per_s']):>9} {_fmt(r['video_seconds_per_s']):>9}"
        )
    current_output().result(result, text="\n".join(lines))


@app.command()
def sweep(
    grid: Annotated[
        list[str],
        typer.Option(
            "--grid", "-g", help="A profile field and its values, e.g. parallel.dp_shard=1,2; repeatable."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="sweep.csv, sweep.json and sweep.png go here.")],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds allowed to each point.")] = 600.0,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run `vidforge bench train` for every combination of the --grid values, each in a fresh process
    (under torchrun when the point's layout has several ranks); write CSV, JSON and a plot of throughput
    against context length, one line per combination of the other fields.

    Example: vidforge bench sweep --grid bench.latent_frames=4,8,16 --grid parallel.dp_shard=1,2 \\
    --set cluster.cpu_processes=2 --out runs/sweep
    """
    from vidforge.bench.sweep import run

    profile_from(profile, set_)  # fail fast on a bad profile, before any point runs
    output = current_output()

    points = itertools.count(1)

    def show(row: dict) -> None:
        if output.json:
            keep = ("point", "ok", "tokens_per_s", "error")
            output.progress("point", next(points), None, **{k: v for k, v in row.items() if k in keep})
        elif row["ok"]:
            output.info(
                f"{row['point']}: {row['tokens_per_s']:,.0f} tokens/s, {row['step_time_s'] * 1000:.1f} ms/step"
            )
        else:
            output.info(f"{row['point']}: failed: {row['error']}")

    result = run(profile, list(set_ or ()), grid, out, timeout=timeout, progress=show)
    data = result.as_dict()
    text = (
        f"bench sweep: {data['points']} point(s), {data['failed']} failed -> {data['csv']}, {data['json']}, "
        + (data["plot"] or f"no plot ({data['plot_note']})")
    )
    output.result(data, text=text)


@app.command()
def plan(
    rank: Annotated[
        bool, typer.Option("--rank", help="Rank every layout of the cluster by predicted throughput.")
    ] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="With --rank, how many layouts to list.")] = 10,
    world_size: Annotated[
        int | None,
        typer.Option(
            "--world-size", min=1, max=MAX_RANKS, help="With --rank, plan for this many ranks instead."
        ),
    ] = None,
    fit: Annotated[
        bool,
        typer.Option(
            "--fit",
            help="List the recipes (layout, recompute, offload; LoRA: fp8 base, block swap) that fit the "
            "model and clip on the machine, fastest first, each as --set lines.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="With --fit: write the fastest recipe as a profile here (the model, its text encoder and "
            "VAE, the clip as the training buckets, the recipe's settings) and print the command that runs it.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="A model preset (wan2.1-14b) or a diffusers Wan transformer folder."),
    ] = None,
    clip: Annotated[
        str | None,
        typer.Option("--clip", help="The training clip in pixels, FRAMESxHEIGHTxWIDTH (81x480x832)."),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, help="GPUs of the one machine (at most 72).")
    ] = None,
    accelerator: Annotated[
        str | None,
        typer.Option("--accelerator", help="The GPU (rtx4090, rtx5090, l40s, a100-40gb, h100, ...)."),
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """The analytic model of the profile's layout: per-rank memory (parameters, gradients, optimizer,
    EMA, activations with the profile's checkpointing, weight copies, communication buffers), the
    communication volume of each parallel dimension over the cluster's links, and the predicted step
    time; with context parallel, the layout under each CP implementation (all-gather, ring, ulysses, 2D
    usp at each Ulysses degree), fastest first. With --rank: every valid layout of the cluster, fastest
    first, with the reasons and what was rejected. With --fit: the recipes that fit the model (--model) and
    clip (--clip) on --gpus GPUs of --accelerator, fastest first, each as the --set lines to paste; -o FILE writes the fastest as a profile and prints the commands that run it. A plan
    that does not fit exits 2, naming the smallest change that does. Nothing runs; no GPU needed.

    Example: vidforge bench plan --profile dit7b_74k_tp2_cp4_64xh100
    Example: vidforge bench plan --profile dit1b_1xh200 --rank --world-size 8
    Example: vidforge bench plan --fit --model wan2.1-14b --clip 81x480x832 --gpus 1 --accelerator rtx4090 --set "train.lora={rank: 16}" -o wan14b_4090.yaml
    """
    from vidforge.bench.plan import evaluate, format_plan, format_ranking, rank_layouts

    given = [*_machine_sets(model, gpus, accelerator), *parse_sets(set_)]
    if clip is not None:  # in the latents of the model's VAE, so the model's family is read first
        given += _clip_sets(
            profile_from(profile, given), clip, from_folder=model is not None and Path(model).is_dir()
        )
    resolved = profile_from(profile, given)
    output = current_output()
    if fit:
        _fit(resolved, given, model, out)
        return
    if out is not None:
        raise UserInputError("bench plan -o FILE: only with --fit (the recipe it writes as a profile)")
    if rank:
        report = rank_layouts(resolved, world_size)
        output.result(report.as_dict(top), text=format_ranking(report, top))
        return
    layout_plan = evaluate(resolved)
    result, text = layout_plan.as_dict(), format_plan(layout_plan, resolved)
    if resolved.layout.cp > 1:
        # The same layout with each context-parallel implementation (1D and 2D; an ST-DiT's two), ranked.
        from vidforge.bench.plan import format_cp_choices, rank_cp_impls

        choices = rank_cp_impls(resolved)
        result["cp_choices"] = [{"cp_impl": name, **choice.as_dict()} for name, choice in choices]
        text += "\n\n" + format_cp_choices(choices)
    if layout_plan.memory is not None and not layout_plan.valid:
        from vidforge.bench.fit import refusal, smallest_change

        change = smallest_change(resolved, layout_plan)
        result["smallest_change"] = change.as_dict() if change else None
        output.result(result, text=text)
        raise UserInputError(refusal(layout_plan, change))
    output.result(result, text=text)


def _fit(resolved, given: list[Override], model: str | None, out: Path | None) -> None:
    """`bench plan --fit`: the recipes that fit, and with -o the fastest one as a profile and the command
    that runs it; exit 2 when the clip asked does not fit, naming the largest one that does."""
    from vidforge.bench.fit import MAX_GPUS, clip_of, data_sets, format_fit, recipe_profile, set_lines
    from vidforge.bench.fit import fit as fit_recipes

    world = resolved.cluster.world_size
    if world > MAX_GPUS:
        raise UserInputError(
            f"bench plan --fit: {world} GPUs; it plans one machine of at most {MAX_GPUS} (--gpus); plan a "
            "cluster's layouts with --rank"
        )
    report = fit_recipes(resolved)
    if model is not None and Path(model).is_dir():
        report.model = Path(model).resolve().name
    output = current_output()
    text = format_fit(report)
    fits = report.recipes and report.clip == report.requested_clip
    if fits and out is not None:
        written = _write_recipe(recipe_profile(resolved, report.recipes[0], out.stem), out, model)
        text += "\n\n" + written
    elif fits:
        text += "\n\nwrite it as a profile, with the command that runs it: add -o RECIPE.yaml"
    output.result({**report.as_dict(8), "profile": str(out) if fits and out else None}, text=text)
    if not report.recipes:
        raise UserInputError(
            f"bench plan --fit: {report.notes[-1]}; use more or larger GPUs (--gpus, --accelerator)"
        )
    if not fits:
        smaller = " ".join(set_lines(data_sets(clip_of(report.clip))))
        raise UserInputError(
            f"bench plan --fit: nothing fits the clip {report.requested_clip} on {report.machine}; the largest "
            f"clip that fits is {report.clip}: train it with {smaller} (plan it with --clip {report.clip})"
        )


def _write_recipe(profile, out: Path, model: str | None) -> str:
    """Write `profile` to `out`, headed by what it is; the lines that say where and how to run it."""
    from vidforge.profile.loading import dump_profile

    folder = model if model is not None and Path(model).is_dir() else None
    base = str(Path(folder).resolve()) if folder else "WAN_FOLDER"
    named = folder or profile.model.preset or "the profile's model"
    header = [
        f"# bench plan --fit: the fastest recipe for {named} on {profile.cluster.gpus_per_node} x "
        f"{profile.cluster.accelerator.name}, clip {max(profile.data.frame_buckets)}x"
        f"{profile.data.buckets[0][0]}x{profile.data.buckets[0][1]}.",
        f"# The weights: {base}" + ("" if folder else f" (a diffusers download of {named})") + "; its text "
        "encoder and VAE: text_encoder and tokenizer below, or the folder's own when --base/--init name it.",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, "\n".join(header) + "\n" + dump_profile(profile))
    run = f"runs/{out.stem}"
    lines = [f"wrote {out}; run it:"]
    keep = _finetune_keeps(profile)
    lines.append(
        "  "
        + command_line("vidforge", "finetune", "VIDEOS", "--base", base, "-o", run, "--profile", out, *keep)
    )
    lines.append(
        "  "
        + command_line(
            "vidforge", "train", "--data", "LATENTS", "--run-dir", run, "--init", base, "--profile", out
        )
    )
    if folder is None:
        lines.append(
            f"  (WAN_FOLDER: the diffusers download of {named}, which gives the text encoder and VAE)"
        )
    return "\n".join(lines)


def _finetune_keeps(profile) -> list[str]:
    """What `vidforge finetune --profile` needs besides the profile to train its recipe: finetune sets its
    own LoRA (or full) defaults over a profile, so `--full` for a full fine-tune, and the recipe's LoRA
    fields those defaults would change, as --set arguments (which win over them)."""
    from vidforge.bench.fit import variant
    from vidforge.finetune import LORA_DEFAULTS

    if profile.train.lora is None:
        return ["--full"]
    defaults = {k: v for k, v in LORA_DEFAULTS.items() if k.startswith("train.lora")}
    after = variant(profile, defaults).train.lora
    given, default = (
        profile.train.lora.model_dump(mode="json"),
        after.model_dump(mode="json") if after else {},
    )
    return set_args({f"train.lora.{k}": v for k, v in given.items() if v != default.get(k)})


def expert_sets(model: dict) -> list[Override]:
    """A two-expert model trains one expert a run: the plan's (either expert: one shape, one cost)."""
    return [Override("train.expert", "high")] if model.get("experts", 1) == 2 else []


def _machine_sets(model: str | None, gpus: int | None, accelerator: str | None) -> list[Override]:
    """--model, --gpus and --accelerator as the settings they stand for (--clip: `_clip_sets`)."""
    sets: list[Override] = []
    if model is not None:
        if Path(model).is_dir():
            from vidforge.weights.weights_folder import published_sets, resolve_weights

            found = resolve_weights(model, "--model")
            if found.published is None:
                raise UserInputError(
                    f"--model {model}: a vidforge export; plan its profile with --profile EXPORT/profile.yaml"
                )
            # the folder's model replaces the profile's model section (whose fields would otherwise win)
            sets += [Override("model", {}), *published_sets(found.published)]
            sets += expert_sets(found.published.model)
        else:
            from vidforge.families import family
            from vidforge.profile import PRESETS

            sets += [Override("model", {"preset": model})]  # the preset's model, not the profile's fields
            if model in PRESETS:  # the family's objective
                spec = family(PRESETS[model]["family"])
                sets += [*as_overrides(spec.profile_defaults), *expert_sets(PRESETS[model])]
    if gpus is not None:
        from vidforge.bench.fit import MAX_GPUS

        if gpus > MAX_GPUS:
            raise UserInputError(
                f"--gpus {gpus}: one machine has at most {MAX_GPUS}; plan a cluster with --profile and --rank"
            )
        sets += as_overrides({"cluster.nodes": 1, "cluster.gpus_per_node": gpus})
    if accelerator is not None:
        sets += [Override("cluster.accelerator", accelerator)]
    return sets


def _clip_sets(resolved: Any, clip: str, from_folder: bool) -> list[Override]:
    """--clip FRAMESxHEIGHTxWIDTH as the planner's latents under the VAE of the model planned: a published
    folder's (its tokenizer settings), else the family's for its presets (`FamilySpec.vae_compression`),
    else the profile's tokenizer; stated as the tokenizer's so the plan's clip is the one asked."""
    from vidforge.bench.fit import latent_sets
    from vidforge.families import family

    parts = clip.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise UserInputError(f"--clip {clip}: give FRAMESxHEIGHTxWIDTH in pixels, e.g. 81x480x832")
    frames, height, width = map(int, parts)
    vae = family(resolved.model.family).vae_compression
    if vae is None or from_folder:
        ct, cs = resolved.tokenizer.temporal_compression, resolved.tokenizer.spatial_compression
    else:
        ct, cs = vae(resolved.model)
    if not (1 <= frames <= MAX_CLIP[0] and (frames - 1) % ct == 0) or not all(
        cs <= n <= MAX_CLIP[1] and n % cs == 0 for n in (height, width)
    ):
        raise UserInputError(
            f"--clip {clip}: frames must be {ct}k+1 (the model's VAE) up to {MAX_CLIP[0]}, height and width "
            f"multiples of {cs} up to {MAX_CLIP[1]}, e.g. {ct * 20 + 1}x{cs * (480 // cs)}x{cs * (832 // cs)}"
        )
    tokenizer = {"tokenizer.temporal_compression": ct, "tokenizer.spatial_compression": cs}
    return as_overrides({**tokenizer, **latent_sets((frames, height, width), ct, cs)})
