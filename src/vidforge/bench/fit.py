"""`vidforge bench plan --fit`: the recipes that fit a model and a clip on a machine, fastest first, each as
the `--set` lines that run it; and, for a plan that does not fit, the smallest change that does.

A recipe is a choice of the memory knobs: the layout over the machine's GPUs (FSDP degree, the rest as
context parallel), activation recompute (none, selective, full), activation offload, the recomputing
blocks' inputs offloaded as well (`train.checkpoint_offload`), and for LoRA (`train.lora`) the float8 base
and the number of swapped blocks. Each is the profile with those `--set` lines, validated as `vidforge
train` validates it (the layout rulebook included) and evaluated by the one memory and time model
(`vidforge.bench.plan.evaluate`). Block swap and the offloads add the copies their prefetch cannot hide:
each swapped block's frozen weights, each offloaded block's saved tensors and each offloaded checkpoint
input cross the host link (cluster.host_bandwidth_gbs) once in the forward and once in the backward,
beside one block's compute; what exceeds that block's compute is exposed. What they pin in host memory,
for every GPU of the machine, stays within bench.memory_headroom of cluster.host_memory_gib. Of the
recipes that differ only in how many blocks swap (or how much is offloaded), only the least that fits is
listed: more is never faster.

When nothing fits the clip, shorter clips (49, 33, 17 frames), then smaller frames (480x832, 320x576,
rounded down to what the model's VAE and patch take) are tried, and the recipes of the largest clip that fits are listed with it; that change is said in the
settings a run trains with (`data.frame_buckets`, `data.buckets`), not the planner's `bench.latent_*`.
`recipe_profile` is the chosen recipe as a whole profile (`bench plan --fit -o FILE`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vidforge.bench.plan import LayoutPlan, divisors, evaluate
from vidforge.errors import UserInputError
from vidforge.estimate.memory_model import GIB, lora_block_bytes
from vidforge.estimate.param_counts import parameter_counts
from vidforge.families import family
from vidforge.profile import RunProfile
from vidforge.profile.loading import ProfileError, apply_overrides, validate_profile
from vidforge.profile.overrides import as_overrides, command_line, set_text, yaml_value

FALLBACK_FRAMES = (81, 49, 33, 17)
FALLBACK_SIZES = ((720, 1280), (480, 832), (320, 576))
MAX_GPUS = 72
"""The most GPUs `--fit` plans for one machine: an NVL72 rack, the largest NVLink domain built (a larger
count is a cluster: `bench plan --rank`)."""


@dataclass
class Recipe:
    sets: dict[str, Any]
    """The recipe's settings (dotted field -> value), each a `--set` line to paste (`set_lines`)."""
    plan: LayoutPlan
    swap_s: float = 0.0
    """The exposed time of the host copies (block swap, activation offload) a step."""
    clip: str = ""

    @property
    def step_s(self) -> float:
        return self.plan.step_s + self.swap_s

    @property
    def host_gib(self) -> float:
        """Pinned host memory the recipe fills: offloaded activations and swapped weights, per GPU."""
        memory = self.plan.memory
        return (memory.offloaded_bytes + memory.host_bytes) / GIB if memory else 0.0

    @property
    def memory_gib(self) -> float:
        return self.plan.memory.total / GIB if self.plan.memory else math.inf

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.plan.tokens_per_step / self.step_s / self.plan.layout.world_size

    def set_lines(self) -> list[str]:
        """The recipe's `--set` lines in a run's terms: a clip other than the one asked as the training
        buckets (`data_sets`) instead of the planner's synthetic sample (bench.latent_*)."""
        return set_lines(self.user_sets())

    def user_sets(self) -> dict[str, Any]:
        planner = {k: v for k, v in self.sets.items() if k.startswith("bench.latent_")}
        rest = {k: v for k, v in self.sets.items() if k not in planner}
        return {**data_sets(clip_of(self.clip)), **rest} if planner and self.clip else rest

    def as_dict(self) -> dict[str, Any]:
        return {
            "sets": dict(self.sets),
            "clip": self.clip,
            "memory_gib": self.memory_gib,
            "host_memory_gib": self.host_gib,
            "capacity_gib": self.plan.capacity_bytes / GIB,
            "step_s": self.step_s,
            "host_copies_exposed_s": self.swap_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "global_batch": self.plan.clips_per_step,
        }


@dataclass
class FitReport:
    model: str
    machine: str
    clip: str
    requested_clip: str
    recipes: list[Recipe]
    tried: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "model": self.model,
            "machine": self.machine,
            "clip": self.clip,
            "requested_clip": self.requested_clip,
            "tried": self.tried,
            "recipes": [r.as_dict() for r in self.recipes[:top]],
            "notes": list(self.notes),
        }


def set_lines(sets: dict[str, Any]) -> list[str]:
    """`sets` as `--set key=value` arguments a shell reads back unchanged, one string each."""
    return [command_line("--set", set_text(item)) for item in as_overrides(sets)]


def clip_of(label: str) -> tuple[int, int, int]:
    """A clip label (`81x480x832`: frames x height x width, as `fit` reports it) as numbers."""
    frames, height, width = (int(x) for x in label.split("x"))
    return frames, height, width


def data_sets(clip: tuple[int, int, int]) -> dict[str, Any]:
    """A clip in pixels as the training buckets a run trains it at: the one frame count, the one size."""
    frames, height, width = clip
    return {"data.frame_buckets": [frames], "data.buckets": [[height, width]]}


def variant(profile: RunProfile, sets: dict[str, Any]) -> RunProfile:
    """`profile` with `sets` applied and validated as `--set` lines are (ProfileError when refused)."""
    data = profile.model_dump(mode="json")
    overrides = as_overrides(sets)
    apply_overrides(data, overrides)
    return validate_profile(data, "bench plan --fit", overrides)


def host_copies_exposed_s(profile: RunProfile, plan: LayoutPlan) -> float:
    """The host copies of block swap and activation offload that the compute does not hide, a step: each
    swapped block's weights and each offloaded block's saved tensors cross the host link in the forward
    and again in the backward, beside one block's compute (see the module docstring)."""
    from vidforge.memory_savers.activation_offload import offloaded_indices

    if plan.memory is None:
        return 0.0
    link = profile.cluster.host_bandwidth_gbs * 1e9
    layers = profile.model.layers
    recompute = {"none": 0.0, "selective": profile.train.checkpoint_ratio, "full": 1.0}[plan.checkpointing]
    forward = plan.compute_s / plan.microbatches / (3 + recompute) / layers  # one block's forward
    backward = forward * (2 + recompute)  # and its backward (with its recompute)
    exposed = 0.0
    train = profile.train
    offloaded = len(
        offloaded_indices(layers, plan.checkpointing, train.checkpoint_ratio, train.activation_offload)
    )
    memory = plan.memory
    inputs = memory.offloaded_inputs
    if inputs:  # checkpoint_offload: each checkpointed block's input, beside that block's compute
        copy = memory.offloaded_input_bytes / inputs / link
        exposed += inputs * (max(0.0, copy - forward) + max(0.0, copy - backward))
    if offloaded:
        copy = (memory.offloaded_bytes - memory.offloaded_input_bytes) / offloaded / link
        exposed += offloaded * (max(0.0, copy - forward) + max(0.0, copy - backward))
    lora = profile.train.lora
    if lora is not None and lora.blocks_to_swap:
        layout = profile.layout  # under FSDP2 each rank copies its shard of a block (over its own link)
        copy = _swapped_block_bytes(profile) / (layout.dp_shard * layout.cp) / link
        swapped = min(lora.blocks_to_swap, layers)
        exposed += swapped * (max(0.0, copy - forward) + max(0.0, copy - backward))
    return exposed * plan.microbatches


def _swapped_block_bytes(profile: RunProfile) -> float:
    return lora_block_bytes(profile, parameter_counts(profile.model))


EVALUATED = [0]
"""Recipes evaluated so far in this process (what `fit` reports as tried)."""


def _evaluate(profile: RunProfile, sets: dict[str, Any], clip: str) -> Recipe | None:
    EVALUATED[0] += 1
    try:
        candidate = variant(profile, sets)
    except (ProfileError, UserInputError):
        return None
    plan = evaluate(candidate)
    if plan.memory is None:
        return None
    recipe = Recipe(dict(sets), plan, host_copies_exposed_s(candidate, plan), clip)
    cluster = candidate.cluster
    host = recipe.host_gib * cluster.devices_per_node
    limit = cluster.host_memory_gib * candidate.bench.memory_headroom
    if host > limit:
        plan.problems.append(
            f"pins {host:.0f} GiB of host memory, more than {candidate.bench.memory_headroom:.0%} of "
            f"cluster.host_memory_gib={cluster.host_memory_gib:g}"
        )
    return recipe


def _least_that_fits(profile: RunProfile, sets: dict[str, Any], key: str, values: list, clip: str):
    """The recipe with the smallest of `values` for `key` that fits (memory falls as it grows): a bisection."""
    lo, hi, best = 0, len(values) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        recipe = _evaluate(profile, {**sets, key: values[mid]}, clip)
        if recipe is not None and recipe.plan.valid:
            best, hi = recipe, mid - 1
        else:
            lo = mid + 1
    return best


def recipes_for_clip(profile: RunProfile, world: int, clip: str) -> tuple[list[Recipe], int]:
    """Every recipe that fits `profile`'s clip on `world` GPUs of its accelerator; how many were tried."""
    lora = profile.train.lora is not None
    layers = profile.model.layers
    found: list[Recipe] = []
    start = EVALUATED[0]
    for shard in divisors(world):
        layout = {
            "parallel.dp_shard": shard,
            "parallel.cp": world // shard,
            "parallel.dp_replicate": 1,
            "parallel.tp": 1,
            "parallel.pp": 1,
        }
        fp8s = (False, True) if lora else (False,)
        # auto first: the memory model's least recompute per block that fits, kept in the written profile
        # (train resolves it at the run's own shape); where it fits without offload no fixed mode is faster
        fitted = {fp8 for fp8 in fp8s if _auto_fits(profile, layout, lora, fp8, clip, found)}
        for mode in ("none", "selective", "full"):
            for fp8 in (f for f in fp8s if f not in fitted):
                sets = {**layout, "train.activation_checkpointing": mode}
                if lora:
                    sets["train.lora.fp8_base"] = fp8
                plain = _evaluate(profile, {**sets, "train.activation_offload": 0}, clip)
                if plain is None:
                    continue
                if plain.plan.valid:
                    found.append(plain)
                    continue
                # the least offload; then with the checkpointed blocks' inputs offloaded too; then (LoRA)
                # the fewest swapped blocks that fit, without and with those inputs offloaded
                free = {"none": 1.0, "selective": 1 - profile.train.checkpoint_ratio, "full": 0.0}[mode]
                offloads = [f for f in (0.25, 0.5, 0.75, 1.0) if f <= free + 1e-9]
                if offloads:
                    recipe = _least_that_fits(profile, sets, "train.activation_offload", offloads, clip)
                    if recipe is not None:
                        found.append(recipe)
                        continue
                inputs = [False, True] if mode != "none" else [False]
                if mode != "none":
                    recipe = _least_that_fits(
                        profile, {**sets, "train.checkpoint_offload": True}, "train.activation_offload",
                        [0.0, *offloads], clip,
                    )  # fmt: skip
                    if recipe is not None:
                        found.append(recipe)
                        continue
                if lora:  # the fewest swapped blocks that fit, at each offload (least first)
                    for offload_inputs in inputs:
                        extra = {"train.checkpoint_offload": True} if offload_inputs else {}
                        for offload in [0.0, *offloads]:
                            recipe = _least_that_fits(
                                profile,
                                {**sets, **extra, "train.activation_offload": offload},
                                "train.lora.blocks_to_swap",
                                list(range(1, layers + 1)),
                                clip,
                            )
                            if recipe is not None:
                                found.append(recipe)
                                break
    found.sort(key=lambda r: (r.step_s, r.memory_gib))
    return found, EVALUATED[0] - start


def _auto_fits(
    profile: RunProfile, layout: dict[str, Any], lora: bool, fp8: bool, clip: str, found: list[Recipe]
) -> bool:
    """Whether `train.activation_checkpointing=auto` fits `layout` without offload (appended to `found`)."""
    sets = {**layout, "train.activation_checkpointing": "auto"}
    if lora:
        sets["train.lora.fp8_base"] = fp8
    recipe = _evaluate(profile, {**sets, "train.activation_offload": 0}, clip)
    if recipe is None or not recipe.plan.valid:
        return False
    found.append(recipe)
    return True


def candidate_clips(profile: RunProfile) -> list[tuple[int, int, int]]:
    """The profile's clip in pixels (frames, height, width), then the smaller fallbacks, most tokens first.
    A fallback is rounded down to what the model takes: frames (k x temporal) + 1, sides multiples of the
    spatial compression times the patch, under the profile's tokenizer and the VAE the family's published
    pipeline pairs with the model (`FamilySpec.vae_compression`; LTX-2's 32 turns 720 into 704)."""
    b, tok, (_, ph, pw) = profile.bench, profile.tokenizer, profile.model.patch
    ct, cs = tok.temporal_compression, tok.spatial_compression
    own = ((b.latent_frames - 1) * ct + 1, b.latent_height * cs, b.latent_width * cs)
    vae = family(profile.model.family).vae_compression
    vt, vs = vae(profile.model) if vae is not None else (ct, cs)
    step_t, step_h, step_w = math.lcm(ct, vt), math.lcm(cs, vs) * ph, math.lcm(cs, vs) * pw
    clips = {own}
    for frames in FALLBACK_FRAMES:
        for h, w in FALLBACK_SIZES:
            h, w = step_h * (h // step_h), step_w * (w // step_w)
            if frames <= own[0] and h * w <= own[1] * own[2]:
                clips.add((1 + step_t * ((min(frames, own[0]) - 1) // step_t), h, w))
    return sorted(clips, key=lambda c: (-(c[0] * c[1] * c[2]), c != own))


def clip_sets(profile: RunProfile, clip: tuple[int, int, int]) -> dict[str, int]:
    return latent_sets(clip, profile.tokenizer.temporal_compression, profile.tokenizer.spatial_compression)


def latent_sets(clip: tuple[int, int, int], temporal: int, spatial: int) -> dict[str, int]:
    """A clip in pixels (frames, height, width) as the planner's latents under a VAE compressing
    `temporal` x `spatial` x `spatial` (its first frame alone: frames (k x temporal) + 1 -> k + 1)."""
    frames, h, w = clip
    return {
        "bench.latent_frames": (frames - 1) // temporal + 1,
        "bench.latent_height": h // spatial,
        "bench.latent_width": w // spatial,
    }


def fit(profile: RunProfile, world: int | None = None) -> FitReport:
    """The recipes that fit `profile`'s model and clip (bench.latent_*) on `world` GPUs (default: the
    cluster's) of its accelerator, fastest first; a shorter or smaller clip's when none fits."""
    world = world or profile.cluster.world_size
    acc = profile.cluster.accelerator
    machine = f"{world} x {acc.name} ({acc.memory_gib:g} GiB)"
    model = profile.model.preset or "custom"
    clips = candidate_clips(profile)
    requested = "x".join(map(str, clips[0]))
    tried = 0
    for clip in clips:
        label = "x".join(map(str, clip))
        sized = variant(profile, clip_sets(profile, clip)) if clip != clips[0] else profile
        recipes, n = recipes_for_clip(sized, world, label)
        tried += n
        if recipes:
            for r in recipes:
                if clip != clips[0]:
                    r.sets = {**clip_sets(profile, clip), **r.sets}
            notes = (
                []
                if clip == clips[0]
                else [f"nothing fits {requested}; the largest clip that fits is {label}"]
            )
            return FitReport(model, machine, label, requested, recipes, tried, notes)
    return FitReport(model, machine, "", requested, [], tried, [f"nothing fits, down to {label}"])


def recipe_profile(profile: RunProfile, recipe: Recipe, name: str) -> RunProfile:
    """The profile that trains `recipe`: `profile` (its model, text encoder and VAE) with the recipe's
    settings, its clip as the planner's sample and as the training buckets, named `name`."""
    clip = clip_of(recipe.clip)
    return variant(profile, {**recipe.sets, **clip_sets(profile, clip), **data_sets(clip), "name": name})


def smallest_change(profile: RunProfile, plan: LayoutPlan) -> Recipe | None:
    """For a plan that does not fit its memory: the recipe on the same GPUs that changes the fewest of
    the profile's settings (the fastest of those), or None."""
    report = fit(profile, plan.layout.world_size)
    if not report.recipes:
        return None
    current = profile.model_dump(mode="json")

    def value(key: str) -> Any:
        node: Any = current
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def changed(r: Recipe) -> dict[str, Any]:
        return {k: v for k, v in r.sets.items() if v != value(k)}

    best = min(report.recipes, key=lambda r: (len(changed(r)), r.step_s))
    return Recipe(changed(best), best.plan, best.swap_s, best.clip)


def refusal(plan: LayoutPlan, change: Recipe | None, command: str = "bench plan") -> str:
    """The one line that refuses a plan that does not fit its memory: what it needs, and the smallest change
    that fits (`smallest_change`'s; None: nothing on these GPUs fits)."""
    fix = (
        f"the smallest change that fits: {' '.join(change.set_lines())} ({change.memory_gib:.1f} GiB, step "
        f"{change.step_s:.3g} s)"
        if change
        else "nothing fits these GPUs at this clip or smaller; use more or larger GPUs"
    )
    planner = {k: v for k, v in (change.sets if change else {}).items() if k.startswith("bench.")}
    if planner:  # the clip as `bench plan` sizes it, to plan the change again
        fix += f"; to plan it: {' '.join(set_lines(planner))}"
    return f"{command}: {plan.problems[-1]}; {fix}"


def format_fit(report: FitReport, top: int = 8) -> str:
    lines = [
        f"bench plan --fit: {report.model} on {report.machine}, clip {report.requested_clip} (frames x height "
        f"x width); {len(report.recipes)} recipe(s) fit of {report.tried} tried, fastest first:"
    ]
    lines += [f"  note: {n}" for n in report.notes]
    if report.recipes:
        lines.append(
            f"  {'#':>2}  {'GiB':>6}  {'host GiB':>8}  {'step s':>7}  {'tok/s/GPU':>9}  {'batch':>5}  recipe"
        )
    for i, r in enumerate(report.recipes[:top], 1):
        knobs = ", ".join(
            f"{k.split('.')[-1]}={yaml_value(v)}"
            for k, v in r.sets.items()
            if not k.startswith(("bench.", "parallel.tp", "parallel.pp", "parallel.dp_replicate"))
        )
        lines.append(
            f"  {i:>2}  {r.memory_gib:>6.1f}  {r.host_gib:>8.1f}  {r.step_s:>7.3g}  {r.tokens_per_s_per_gpu:>9,.0f}  "
            f"{r.plan.clips_per_step:>5}  {knobs}"
            + (f" (host copies expose {r.swap_s:.3g} s)" if r.swap_s else "")
        )
    if report.recipes:
        lines.append("")
        lines.append("the fastest, to paste:")
        lines.append("  " + " ".join(report.recipes[0].set_lines()))
    return "\n".join(lines)
