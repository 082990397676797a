"""The layout rulebook: which parallel layouts vidforge's trainer can run, in one place.

Every check of a layout against the model, the data and the training settings lives here, and
everything that decides about layouts asks it: the profile validator (a profile whose layout cannot
train fails when it loads), `vidforge bench plan` (it never proposes a layout that fails here),
`vidforge train --dry-run` and `vidforge bench train` (they only get loaded profiles) and the training
loop itself. So when the trainer learns to run a layout, its rule is deleted here and nothing else
changes.

Each rule returns `field: what is wrong; what to change`, one line, naming the profile field to change.
Sampling has rules of its own: the model's layout rules on `vidforge infer --nproc N`'s layout
(`sampling_layout_problems`), and what a sampling run (`SamplingRun`: its processes, an image or not)
cannot do with the profile (`sampling_run_problems`), asked by `vidforge infer` before anything loads.
Pure data: no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vidforge.families import family
from vidforge.profile.parallel import SLIDING_TILE_CP_IMPLS, Layout
from vidforge.profile.run_profile import RunProfile

Rule = Callable[["RunProfile", Layout], list[str]]


def _heads(profile: RunProfile, layout: Layout) -> list[str]:
    heads, impl = profile.model.heads, profile.parallel.cp_impl
    problems = []
    if heads % layout.tp:
        problems.append(f"parallel.tp: must divide model.heads={heads}, got {layout.tp}")
    if layout.cp > 1 and impl == "ulysses" and heads % (layout.tp * layout.cp):
        problems.append(
            f"parallel.cp: ulysses context parallel needs tp x cp = {layout.tp * layout.cp} to divide "
            f"model.heads={heads}; use cp_impl=ring or all-gather, or another cp"
        )
    ulysses = profile.parallel.cp_ulysses
    if layout.cp > 1 and impl == "usp" and heads % (layout.tp * ulysses):
        problems.append(
            f"parallel.cp_ulysses: usp splits heads over tp x cp_ulysses = {layout.tp * ulysses}, which must "
            f"divide model.heads={heads}; use a smaller cp_ulysses"
        )
    return problems


def _cp_2d(profile: RunProfile, layout: Layout) -> list[str]:
    """2D context parallel (cp_impl=usp): cp = cp_ulysses x cp_ring. Without context parallel (cp 1, a
    layout the planner tries) there is nothing to split."""
    ulysses = profile.parallel.cp_ulysses
    if layout.cp == 1 or profile.parallel.cp_impl != "usp" or layout.cp % ulysses == 0:
        return []
    return [
        f"parallel.cp_ulysses: {ulysses} must divide parallel.cp={layout.cp} (cp = cp_ulysses x cp_ring); "
        "change cp_ulysses or cp"
    ]


def frame_split_fits(count: int, cp: int) -> bool:
    """Whether slicing by frames (st-hybrid, ScaleFusion) splits a token grid's `count` frames, or its
    H x W positions, over cp ranks: each rank holds whole frames for spatial attention and whole
    positions for temporal attention, so both must divide by cp. Training's buckets and infer's video
    size are both held to it."""
    return count % cp == 0


def position_split_fits(positions: int, cp: int) -> bool:
    """Whether st-spatial's slicing by (h, w) positions of every frame gives each of cp ranks at least
    one position of a frame with `positions` (fewer leaves some rank only pads)."""
    return positions >= cp


def _stdit_slicing(profile: RunProfile, layout: Layout, impl: str) -> list[str] | None:
    """The gate of an ST-DiT slicing `impl` (st-hybrid, st-spatial): [] where it is not in use (cp 1 or
    another cp_impl), the refusal where the model is no ST-DiT, None where the slicing's own checks run."""
    if layout.cp == 1 or profile.parallel.cp_impl != impl:
        return []
    if profile.model.architecture != "stdit":
        return [f"parallel.cp_impl: {impl} is for model.architecture=stdit; use all-gather, ring or ulysses"]
    return None


def _bucket_positions(profile: RunProfile) -> list[tuple[int, int, int]]:
    """(h, w, token positions a frame) for each of data.buckets."""
    tok, (_, ph, pw) = profile.tokenizer, profile.model.patch
    return [
        (h, w, (h // tok.spatial_compression // ph) * (w // tok.spatial_compression // pw))
        for h, w in profile.data.buckets
    ]


def _st_hybrid(profile: RunProfile, layout: Layout) -> list[str]:
    """st-hybrid splits each clip by frames for spatial attention and by (h, w) positions for temporal
    attention: every data bucket's token grid needs T and H x W divisible by cp."""
    if (gate := _stdit_slicing(profile, layout, "st-hybrid")) is not None:
        return gate
    cp, tok, pt = layout.cp, profile.tokenizer, profile.model.patch[0]
    problems = []
    for frames in profile.data.frame_buckets:
        t = ((frames - 1) // tok.temporal_compression + 1) // pt
        if not frame_split_fits(t, cp):
            problems.append(
                f"data.frame_buckets: {frames} frames give {t} latent token frames, not divisible by "
                f"parallel.cp={cp} (st-hybrid splits clips by frames); change the bucket or cp"
            )
    for h, w, positions in _bucket_positions(profile):
        if not frame_split_fits(positions, cp):
            problems.append(
                f"data.buckets: ({h}, {w}) gives {positions} token positions a frame, not divisible by "
                f"parallel.cp={cp} (st-hybrid splits temporal attention by position); change the bucket or cp"
            )
    return problems


def _st_spatial(profile: RunProfile, layout: Layout) -> list[str]:
    """st-spatial gives each rank (h, w) positions of every frame (any T: images and odd frame counts
    work) and splits spatial attention's heads over cp: tp x cp must divide the heads, and every bucket
    needs at least cp positions a frame (else some rank holds only pads). H x W not divisible by cp is
    allowed: the last position columns of some ranks are pads."""
    if (gate := _stdit_slicing(profile, layout, "st-spatial")) is not None:
        return gate
    cp, heads = layout.cp, profile.model.heads
    problems = []
    if heads % (layout.tp * cp):
        problems.append(
            f"parallel.cp: st-spatial splits spatial attention's heads over tp x cp = {layout.tp * cp}, which "
            f"must divide model.heads={heads}; change cp or tp, or use parallel.cp_impl=st-hybrid"
        )
    for h, w, positions in _bucket_positions(profile):
        if not position_split_fits(positions, cp):
            problems.append(
                f"data.buckets: ({h}, {w}) gives {positions} token positions a frame, fewer than "
                f"parallel.cp={cp} (st-spatial splits every frame's positions); use a larger bucket or a smaller cp"
            )
    return problems


def _stdit_cp(profile: RunProfile, layout: Layout) -> list[str]:
    """ST-DiT's spatial and temporal attention are not full attention: the full-attention cp_impls
    (all-gather, ring, ulysses, usp) cannot split them, so an ST-DiT under context parallel takes one of
    the two slicings made for it (else the first step fails inside ContextParallelAttend)."""
    impl = profile.parallel.cp_impl
    if layout.cp == 1 or profile.model.architecture != "stdit" or impl in ("st-hybrid", "st-spatial"):
        return []
    return [
        f"parallel.cp_impl: {impl} splits full attention only; model.architecture=stdit under cp={layout.cp} "
        "needs st-spatial (any frame count) or st-hybrid (frames divisible by cp)"
    ]


def _stages(profile: RunProfile, layout: Layout) -> list[str]:
    stages = layout.pp * layout.vpp
    if profile.model.layers % stages:
        return [
            f"parallel.pp: pp x vpp = {stages} must divide model.layers={profile.model.layers}, "
            f"got pp={layout.pp}, vpp={layout.vpp}"
        ]
    return []


def _pipeline(profile: RunProfile, layout: Layout) -> list[str]:
    """What the pipeline schedule needs, and what it does not combine with (yet). Context parallel it
    does: each stage holds its cp rank's shard of the stream (`vidforge.train.step.PipelineTrainStep`)."""
    if layout.pp == 1:
        if layout.vpp > 1:
            return [
                f"parallel.vpp: {layout.vpp} virtual stages need pipeline parallel (parallel.pp > 1); set vpp=1"
            ]
        return []
    schedule, pp, micro = profile.parallel.pp_schedule, f"parallel.pp={layout.pp}", layout.pp_microbatches
    problems = []
    if schedule == "interleaved-1f1b" and layout.vpp < 2:
        problems.append("parallel.pp_schedule: interleaved-1f1b needs parallel.vpp >= 2; set vpp or use 1f1b")
    if layout.vpp > 1 and schedule != "interleaved-1f1b":
        problems.append(
            f"parallel.vpp: {layout.vpp} virtual stages need pp_schedule=interleaved-1f1b, got {schedule}"
        )
    if schedule == "1f1b" and micro < layout.pp:
        problems.append(
            f"parallel.pp_microbatches: 1F1B needs at least pp={layout.pp} micro-batches, got {micro}; "
            "raise it (0 picks pp x vpp)"
        )
    if profile.train.grad_accum > 1:
        problems.append(
            f"train.grad_accum: {pp} with grad_accum={profile.train.grad_accum}: the pipeline's micro-batches "
            "are its gradient accumulation; set train.grad_accum=1 and raise parallel.pp_microbatches instead"
        )
    if not profile.data.packing and profile.data.batch_size % micro:
        problems.append(
            f"data.batch_size: {profile.data.batch_size} with {micro} pipeline micro-batches: the pipeline "
            "splits each batch evenly into its micro-batches; make data.batch_size a multiple of "
            "parallel.pp_microbatches"
        )
    if (profile.train.validate_every or 0) > 0:
        problems.append(
            f"train.validate_every: {profile.train.validate_every} with {pp}: validation samples with the "
            "whole model and a pipeline rank holds only its stages; set train.validate_every=0 and sample "
            "the exported model with `vidforge infer`, or train with pp=1"
        )
    return problems


def _sliding_tiles(profile: RunProfile, layout: Layout) -> list[str]:
    """Sliding-tile and video sparse attention (model.attention_window, attention_topk): the tile must fit the token grid of the videos
    `vidforge infer` samples (training buckets may be smaller, images among them: a tile wider than a
    grid is one partial tile there). Under context parallel the windows are applied across ranks by
    all-gather, ring and Ulysses (`vidforge.attention.sliding_tile.TiledShard`); usp and the ST-DiT
    slicings have no plan for them."""
    model = profile.model
    if model.attention_window is None and model.attention_topk is None:
        return []
    tok, inf, (pt, ph, pw) = profile.tokenizer, profile.infer, model.patch
    spatial = tok.spatial_compression
    grid = (
        ((inf.frames - 1) // tok.temporal_compression + 1) // pt,
        inf.height // spatial // ph,
        inf.width // spatial // pw,
    )
    problems = []
    if any(c > g for c, g in zip(model.attention_tile, grid, strict=True)):
        problems.append(
            f"model.attention_tile: {list(model.attention_tile)} tokens do not fit the token grid {list(grid)} "
            "of infer.frames/height/width; use a tile of at most that per axis"
        )
    impl = profile.parallel.cp_impl
    if layout.cp > 1 and model.attention_topk is not None:
        problems.append(
            f"parallel.cp: video sparse attention (model.attention_topk) has no context-parallel plan (its "
            f"coarse pass needs every rank's tiles); set parallel.cp=1 (got {layout.cp}) or drop attention_topk"
        )
    elif layout.cp > 1 and impl not in SLIDING_TILE_CP_IMPLS:
        problems.append(
            f"parallel.cp_impl: sliding-tile attention (model.attention_window) runs under cp_impl "
            f"{', '.join(SLIDING_TILE_CP_IMPLS)}, not {impl}; change cp_impl or set parallel.cp=1"
        )
    return problems


def _lora(profile: RunProfile, layout: Layout) -> list[str]:
    """LoRA (peft's adapter layers) runs under FSDP2 (HSDP and context parallel take the same path).
    Tensor parallel's plans name the plain Linear layers that peft wraps (their adapters would stay whole
    beside a sharded base), pipeline stages have not been run with adapters, and float8 would convert the
    frozen base's Linears: all three are refused. Block swap under FSDP2 keeps the swapped blocks' shards
    in host memory, which FSDP2's CPU offload already does for every block: the pair is refused."""
    if profile.train.lora is None:
        return []
    problems = []
    if layout.tp > 1:
        problems.append(
            f"train.lora: LoRA has no tensor-parallel plan (parallel.tp={layout.tp}); set parallel.tp=1 and "
            "shard with parallel.dp_shard (FSDP2) instead, or unset train.lora for a full fine-tune"
        )
    if layout.pp > 1:
        problems.append(
            f"train.lora: LoRA does not run under pipeline parallel (parallel.pp={layout.pp}); set "
            "parallel.pp=1 and shard with parallel.dp_shard (FSDP2) instead"
        )
    if profile.train.fp8:
        problems.append(
            "train.fp8: torchao's float8 matmuls do not convert LoRA's frozen base; set train.fp8=false "
            "(train.lora.fp8_base=true stores the base in float8)"
        )
    fsdp = layout.dp_shard * layout.cp * layout.dp_replicate > 1
    if profile.train.lora.blocks_to_swap and profile.train.fsdp_cpu_offload and fsdp:
        problems.append(
            "train.lora.blocks_to_swap: train.fsdp_cpu_offload already keeps every block's FSDP2 shards in "
            "host memory; set train.lora.blocks_to_swap=0 or train.fsdp_cpu_offload=false"
        )
    if profile.train.lora.blocks_to_swap > profile.model.layers:
        problems.append(
            f"train.lora.blocks_to_swap: {profile.train.lora.blocks_to_swap} is more than the model's "
            f"{profile.model.layers} blocks; set at most {profile.model.layers}"
        )
    return problems


def _fp8(profile: RunProfile, layout: Layout) -> list[str]:
    """torchao's Float8Linear needs float8 tensor-parallel styles (Float8ColwiseParallel, ...) that
    vidforge's TP plans do not use. A rule here, not only in the build (`check_tp_model`), so that the
    profile refuses it when it loads and the planner and the dry run never offer it."""
    if not profile.train.fp8 or layout.tp == 1:
        return []
    return [
        f"train.fp8: tensor parallel has no float8 plan (parallel.tp={layout.tp}); set train.fp8=false or "
        "parallel.tp=1"
    ]


def _distill(profile: RunProfile, layout: Layout) -> list[str]:
    """DMD2's step (`vidforge.train.distill`) runs its student, teacher and fake score as whole models on
    whole sequences: one process or data parallel (FSDP, HSDP, tp), no pipeline stages or cp shards."""
    if profile.train.distill is None:
        return []
    return [
        f"parallel.{name}: train.distill runs one process or data parallel (FSDP, tp), not {what} parallel "
        f"({name}={degree}); set parallel.{name}=1"
        for name, what, degree in (("pp", "pipeline", layout.pp), ("cp", "context", layout.cp))
        if degree > 1
    ]


def _image_condition(profile: RunProfile, layout: Layout) -> list[str]:
    """First-frame conditioning (`diffusion.image_condition`, Wan2.2 TI2V) gives the first latent frame's
    tokens level 0: it needs a model with `expand_timesteps` (a level per token), the flow objective (a
    clean token's level 0 is t = 0 there only) and a student that does not generate from noise alone (no
    train.distill). The token splits of context and pipeline parallel carry no per-token level yet (nor
    sequence parallel's: `sequence_parallel_blocker`)."""
    if not profile.diffusion.image_condition:
        return []
    fix = "or set diffusion.image_condition=0"
    problems = []
    if not profile.model.expand_timesteps:
        problems.append(
            "diffusion.image_condition: model.expand_timesteps is off (a first-frame conditioned model, e.g. "
            f"Wan2.2 TI2V, has it); {fix}"
        )
    if profile.diffusion.objective != "flow":
        problems.append(f"diffusion.image_condition: needs diffusion.objective=flow; {fix}")
    if profile.train.distill is not None:
        problems.append(f"diffusion.image_condition: train.distill distils text-to-video; {fix}")
    problems += [
        f"parallel.{name}: first-frame conditioning (diffusion.image_condition) trains without {what} "
        f"parallel ({name}={degree}); set parallel.{name}=1 {fix}"
        for name, what, degree in (("cp", "context", layout.cp), ("pp", "pipeline", layout.pp))
        if degree > 1
    ]
    return problems


def sequence_parallel_blocker(profile: RunProfile) -> tuple[str, str] | None:
    """Why tensor parallel cannot also split the sequence in this run, as (what, its other fix), or None
    when it can: the family's tensor-parallel plan has no sequence parallel (`FamilySpec.sequence_parallel`),
    or first-frame conditioning gives tokens levels of their own, which the row split does not carry (the
    rows the tp ranks sum would be each rank's own tokens')."""
    name = profile.model.family
    if not family(name).sequence_parallel:
        return f"model.family={name}'s tensor-parallel plan has no sequence parallel", ""
    if profile.diffusion.image_condition:
        return (
            "first-frame conditioning (diffusion.image_condition) trains without sequence parallel",
            ", or set diffusion.image_condition=0",
        )
    return None


def sequence_parallel(profile: RunProfile) -> bool:
    """Whether tensor parallel also shards the sequence (Megatron SP) in this run: parallel.sequence_parallel
    when the user set it, else the family's choice, on unless `sequence_parallel_blocker` names a reason.
    Everything that runs or costs a layout asks here (the TP plan of training and of `vidforge infer`, the
    memory and communication models, so `bench plan`), never the field itself."""
    asked = profile.parallel.sequence_parallel
    return sequence_parallel_blocker(profile) is None if asked is None else asked


def _sequence_parallel(profile: RunProfile, layout: Layout) -> list[str]:
    """parallel.sequence_parallel=true asked for where it cannot run (unset, the run goes without)."""
    blocker = sequence_parallel_blocker(profile)
    if layout.tp == 1 or profile.parallel.sequence_parallel is not True or blocker is None:
        return []
    what, other = blocker
    return [
        f"parallel.sequence_parallel: {what} (tp={layout.tp}); set parallel.sequence_parallel=false or "
        f"leave it unset{other}"
    ]


def _image_validation(profile: RunProfile, layout: Layout) -> list[str]:
    """An image-to-video model (`model.condition_channels`, Wan2.1-I2V) samples from a first frame, which
    validation's prompts lack."""
    every = profile.train.validate_every
    if not profile.model.samples_from_image or not every:
        return []
    return [
        f"train.validate_every: {every}: an image-to-video model's validation needs a first frame; set "
        "train.validate_every=0 and sample the export with `vidforge infer --image`"
    ]


def _family(profile: RunProfile, layout: Layout) -> list[str]:
    """The model family's own refusals (`FamilySpec.layout_rules`): what its network has no code for."""
    return family(profile.model.family).layout_rules(profile, layout)


RULES: tuple[Rule, ...] = (
    _heads,
    _cp_2d,
    _stdit_cp,
    _st_hybrid,
    _st_spatial,
    _stages,
    _pipeline,
    _sliding_tiles,
    _lora,
    _fp8,
    _distill,
    _image_condition,
    _sequence_parallel,
    _image_validation,
    _family,
)


def layout_problems(profile: RunProfile, layout: Layout | None = None) -> list[str]:
    """Everything that keeps vidforge's trainer from running `layout` (default: the profile's own on its
    cluster, whose world size must then match) for this profile, each as `field: message`."""
    if layout is None:
        try:
            layout = profile.parallel.resolve(profile.cluster.world_size)
        except ValueError as err:
            # Still check the other rules, on the degrees as given, so every problem is reported at once.
            par = profile.parallel
            problems = [f"parallel: {err} (world size = {profile.cluster.world_size_field})"]
            layout = Layout(
                par.pp,
                par.dp_replicate,
                max(1, par.dp_shard),
                par.cp,
                par.tp,
                par.vpp,
                par.pp_microbatches or par.pp * par.vpp,
            )
            return problems + [p for rule in RULES for p in rule(profile, layout)]
    return [p for rule in RULES for p in rule(profile, layout)]


# Sampling (`vidforge infer --nproc N`) runs a layout of its own: cfg (on the dp_replicate dimension) x cp
# x tp(infer.tp). Of the trainer's rules only the model's hold there; the data buckets, the pipeline and
# LoRA training are the trainer's. Their messages name the training fields: the sampler says which of its
# own settings gave the degrees.
SAMPLING_RULES: tuple[Rule, ...] = (_heads, _cp_2d, _sliding_tiles, _sequence_parallel, _family)


def sampling_layout_problems(profile: RunProfile, layout: Layout) -> list[str]:
    """What keeps `vidforge infer` from sampling with `layout` (pp 1, dp_replicate = the guidance
    branches, cp = the sequence ranks, tp = infer.tp), each as `field: message`."""
    return [p for rule in SAMPLING_RULES for p in rule(profile, layout)]


@dataclass(frozen=True)
class SamplingRun:
    """What `vidforge infer` is asked to run beside its profile: `world` processes (--nproc), an image to
    start from or not (--image)."""

    world: int = 1
    image: bool = False


SamplingRule = Callable[["RunProfile", SamplingRun], list[str]]


def _one_process(profile: RunProfile, run: SamplingRun) -> list[str]:
    """What samples in one process only, and infer.tp, which needs as many."""
    world, problems = run.world, []
    if world == 1 and profile.infer.tp > 1:
        problems.append(
            f"infer.tp: {profile.infer.tp} ranks hold the model tensor-parallel, but one process runs; "
            f"use --nproc {profile.infer.tp} (or a multiple), or set infer.tp=1"
        )
    if world > 1 and profile.model.experts == 2:
        problems.append(
            f"--nproc {world}: a two-expert model (model.experts=2) samples in one process; drop --nproc"
        )
    if world > 1 and run.image:
        problems.append(
            f"--image: image-conditioned sampling runs in one process, not over {world}; drop --nproc"
        )
    if world > 1 and profile.infer.cache.threshold > 0:
        problems.append(
            f"infer.cache.threshold: step caching runs in one process, not over --nproc {world}; "
            "set infer.cache.threshold=0 or drop --nproc"
        )
    return problems


def _image(profile: RunProfile, run: SamplingRun) -> list[str]:
    """Which models take --image, and how: through condition channels (Wan2.1-I2V, Wan2.2 I2V-A14B),
    which need one, or as the first latent frame (model.expand_timesteps, Wan2.2 TI2V), one network's."""
    model = profile.model
    if model.condition_channels and not model.samples_from_image:
        if not run.image:
            return []
        return [
            f"--image: this {model.family} model samples from text, its condition channels zeros; drop --image"
        ]
    if model.condition_channels:
        if run.image:
            return []
        return [
            f"--image: this {model.family} model is image-to-video (model.condition_channels="
            f"{model.condition_channels}); give the first frame to animate with --image PATH"
        ]
    if not run.image:
        return []
    if not model.expand_timesteps:
        return [
            f"--image: model.family={model.family} with model.expand_timesteps off samples from text only; "
            "drop --image, or sample an image-conditioned model (e.g. Wan2.2 TI2V)"
        ]
    if model.experts == 2:
        return [
            "--image: a two-expert model samples from an image through its condition channels "
            "(model.condition_channels, Wan2.2 I2V-A14B), not through model.expand_timesteps; drop --image"
        ]
    return []


def _experts_cache(profile: RunProfile, run: SamplingRun) -> list[str]:
    if profile.model.experts != 2 or profile.infer.cache.threshold <= 0:
        return []
    return [
        "infer.cache.threshold: step caching is fitted to one network's outputs, not to two experts'; "
        "set infer.cache.threshold=0"
    ]


def _family_sampling(profile: RunProfile, run: SamplingRun) -> list[str]:
    """The model family's own refusals of a sampling run (`FamilySpec.sampling_rules`)."""
    return family(profile.model.family).sampling_rules(profile, run)


SAMPLING_RUN_RULES: tuple[SamplingRule, ...] = (_image, _one_process, _experts_cache, _family_sampling)


def sampling_run_problems(profile: RunProfile, run: SamplingRun) -> list[str]:
    """What keeps `vidforge infer` from running `run` with `profile`, each as `field: message` (the
    field a setting or a flag), known before anything loads."""
    return [p for rule in SAMPLING_RUN_RULES for p in rule(profile, run)]
