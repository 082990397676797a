"""`vidforge bench plan`: the analytic model of a layout (memory per rank, communication per step, predicted
step time), and every valid layout of a cluster for a model ranked by predicted throughput, with the
reasons each is where it is and why the others were rejected.

Predicted step time of one rank, for `m` micro-batches a step:

    compute  = m x (model FLOPs of a micro-batch, forward + backward + recompute) / (cp x tp x pp)
               / (accelerator peak x the rate the GPU suite measured on it, estimate.measured_rates;
                  bench.achievable_mfu where it has not run or where the user sets it)
    bubble   = compute x (pp - 1) / m                       (1F1B pipeline fill and drain)
    exposed  = time of the collectives on the critical path (TP, CP all-gather / all-to-all, PP)
    hidden   = time of the overlapped ones (FSDP, HSDP, ring CP); only what exceeds compute counts
    step     = compute + bubble + exposed + max(0, hidden - compute)

Layouts are ranked by tokens per second per GPU (each layout's own batch: train.micro_batch clips per
data-parallel rank, m micro-batches). Each layout gets the least activation recompute that fits its
memory (none, then selective, then full), because recompute costs time. An ST-DiT whose parallel.cp_impl
is either of its sequence parallels (st-hybrid slices clips by frames, st-spatial by positions) has both
weighed per context-parallel layout: what the rulebook refuses for the data buckets (st-hybrid: odd latent
frame counts, images) is out, and of the rest the faster prediction wins (their traffic differs with the
block and the pad columns), the profile's own on a tie."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vidforge.estimate.comm_model import CommTerm, communication
from vidforge.estimate.measured_rates import achievable_mfu
from vidforge.estimate.memory_model import GIB, MemoryEstimate, estimate_memory
from vidforge.estimate.recompute import resolve_auto
from vidforge.estimate.workload import Workload
from vidforge.models.flops import forward_flops
from vidforge.profile import RunProfile
from vidforge.profile.layout_rules import layout_problems
from vidforge.profile.parallel import Layout

CHECKPOINTING = ("none", "selective", "full")
ST_CP_IMPLS = ("st-hybrid", "st-spatial")
"""ST-DiT's two sequence parallels, which the planner chooses between per layout."""


@dataclass
class LayoutPlan:
    layout: Layout
    checkpointing: str
    microbatches: int
    cp_impl: str | None = None
    """parallel.cp_impl of this plan (None without context parallel)."""
    memory: MemoryEstimate | None = None
    comm: list[CommTerm] = field(default_factory=list)
    compute_s: float = 0.0
    bubble_s: float = 0.0
    step_s: float = math.inf
    tokens_per_step: int = 0
    clips_per_step: int = 0
    """The global batch: train.micro_batch clips x micro-batches x data-parallel ranks."""
    capacity_bytes: float = 0.0
    problems: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_s / self.layout.world_size if self.step_s > 0 else 0.0

    @property
    def name(self) -> str:
        lay = self.layout
        return f"pp{lay.pp} dp_replicate{lay.dp_replicate} dp_shard{lay.dp_shard} cp{lay.cp} tp{lay.tp}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.degrees(),
            "describe": self.layout.describe(),
            "checkpointing": self.checkpointing,
            "microbatches": self.microbatches,
            "cp_impl": self.cp_impl,
            "valid": self.valid,
            "problems": list(self.problems),
            "why": list(self.why),
            "memory": self.memory.as_dict() if self.memory else None,
            "memory_capacity_gib": self.capacity_bytes / GIB,
            "communication": [c.as_dict() for c in self.comm],
            "compute_s": self.compute_s,
            "bubble_s": self.bubble_s,
            "step_s": self.step_s,
            "tokens_per_step": self.tokens_per_step,
            "global_batch": self.clips_per_step,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
        }


def structural_problems(profile: RunProfile, layout: Layout) -> list[str]:
    """Why a layout is not proposed, whatever the memory: what the trainer cannot run (the layout
    rulebook, `vidforge.profile.layout_rules`), and tensor parallel across nodes, which runs but puts
    its collectives on the slow links. One `field: reason` per problem."""
    problems = layout_problems(profile, layout)
    devices = profile.cluster.devices_per_node
    if layout.tp > devices:
        problems.append(
            f"parallel.tp={layout.tp} spans nodes (gpus_per_node={devices}): its collectives are "
            "on the critical path and need the intra-node links"
        )
    return problems


def _flops_per_microbatch(profile: RunProfile, workload: Workload, checkpointing: str) -> float:
    """Hardware FLOPs of a micro-batch: the model's, plus the recomputed forward of the checkpointed blocks."""
    from vidforge.memory_savers.activation_checkpoint import recompute_fraction

    grids = [workload.grid] * workload.samples
    count = forward_flops(
        profile.model, grids, workload.text_tokens, workload.image_tokens, workload.token_levels
    )
    return count.train_step(
        recompute_fraction(profile.model.layers, checkpointing, profile.train.checkpoint_ratio)
    )


def evaluate(
    profile: RunProfile,
    layout: Layout | None = None,
    checkpointing: str | None = None,
    workload: Workload | None = None,
    microbatches: int | None = None,
) -> LayoutPlan:
    """Memory, communication and predicted step time of one layout (default: the profile's own, with its
    activation checkpointing)."""
    layout = layout or profile.layout
    workload = workload or Workload.from_profile(profile)
    mode = checkpointing or profile.train.activation_checkpointing
    recompute = None
    if mode == "auto":  # the memory model's mix of full, op-level and no recompute per block
        auto = profile.model_copy(
            update={"train": profile.train.model_copy(update={"activation_checkpointing": mode})}
        )
        profile, recompute = resolve_auto(auto, layout, workload)
        mode = profile.train.activation_checkpointing
    if microbatches is None:
        microbatches = layout.pp_microbatches if layout.pp > 1 else profile.train.grad_accum
    plan = LayoutPlan(layout, mode, microbatches, profile.parallel.cp_impl if layout.cp > 1 else None)
    plan.problems = structural_problems(profile, layout)
    plan.capacity_bytes = profile.cluster.accelerator.memory_gib * GIB * profile.bench.memory_headroom
    if plan.problems:
        return plan
    variant = profile.model_copy(
        update={"train": profile.train.model_copy(update={"activation_checkpointing": mode})}
    )
    plan.memory = estimate_memory(variant, layout, workload)
    plan.comm = communication(profile, layout, workload, microbatches, mode)
    peak = profile.cluster.accelerator.peak_bf16_flops * achievable_mfu(profile)[0]
    flops = microbatches * _flops_per_microbatch(profile, workload, mode)
    plan.compute_s = flops / (layout.cp * layout.tp * layout.pp) / peak
    plan.bubble_s = plan.compute_s * (layout.pp - 1) / (microbatches * layout.vpp)
    exposed = sum(c.seconds for c in plan.comm if not c.overlapped)
    hidden = sum(c.seconds for c in plan.comm if c.overlapped)
    plan.step_s = plan.compute_s + plan.bubble_s + exposed + max(0.0, hidden - plan.compute_s)
    plan.tokens_per_step = workload.tokens * microbatches * layout.dp
    plan.clips_per_step = workload.samples * microbatches * layout.dp
    total = plan.memory.total
    if total > plan.capacity_bytes:
        plan.problems.append(
            f"needs {total / GIB:.1f} GiB per rank with {mode} activation checkpointing, more than "
            f"{profile.bench.memory_headroom:.0%} of {profile.cluster.accelerator.memory_gib:g} GiB"
        )
    plan.why = _reasons(plan, profile, workload, exposed, hidden)
    if recompute is not None:
        plan.why.append(recompute.describe())
    return plan


def _reasons(
    plan: LayoutPlan, profile: RunProfile, workload: Workload, exposed: float, hidden: float
) -> list[str]:
    mem, lay = plan.memory, plan.layout
    assert mem is not None  # evaluated layouts only
    shards = lay.dp_shard * lay.cp
    out = [
        f"memory {mem.total / GIB:.1f} of {plan.capacity_bytes / GIB:.0f} GiB: weights, gradients, AdamW and EMA "
        f"{mem.state / GIB:.1f} GiB (sharded {shards} ways{f', TP {lay.tp}' if lay.tp > 1 else ''}"
        f"{f', PP {lay.pp}' if lay.pp > 1 else ''}), activations {mem.get('activations') / GIB:.1f} GiB at "
        f"{workload.tokens / lay.cp:,.0f} tokens/rank ({plan.checkpointing} checkpointing)"
    ]
    out.append(
        f"compute {plan.compute_s:.3g} s, exposed communication {exposed:.3g} s, overlapped {hidden:.3g} s"
        + (f", pipeline bubble {plan.bubble_s:.3g} s" if plan.bubble_s else "")
    )
    if plan.comm:
        top = max(plan.comm, key=lambda c: c.seconds)
        out.append(
            f"largest collective: {top.dim} {top.bytes / 1e9:.3g} GB/step over {top.link} links "
            f"({top.bandwidth_gbs:g} GB/s) = {top.seconds:.3g} s{' (overlapped)' if top.overlapped else ''}"
        )
    return out


def _least_recompute(profile: RunProfile, layout: Layout, workload: Workload, micro: int) -> LayoutPlan:
    """The layout with the least activation checkpointing that fits (or the last one tried)."""
    plan = None
    for mode in ("auto",) if profile.train.activation_checkpointing == "auto" else CHECKPOINTING:
        plan = evaluate(profile, layout, mode, workload, micro)
        if plan.valid or plan.memory is None:
            break
    assert plan is not None
    return plan


def cp_impl_variants(profile: RunProfile, layout: Layout) -> list[RunProfile]:
    """The profiles the planner weighs for a layout: the profile itself, and for a context-parallel
    ST-DiT on one of `ST_CP_IMPLS` the same with the other one."""
    impl = profile.parallel.cp_impl
    if layout.cp == 1 or profile.model.architecture != "stdit" or impl not in ST_CP_IMPLS:
        return [profile]
    other = next(i for i in ST_CP_IMPLS if i != impl)
    parallel = profile.parallel.model_copy(update={"cp_impl": other})
    return [profile, profile.model_copy(update={"parallel": parallel})]


def _best_cp_impl(profile: RunProfile, layout: Layout, workload: Workload, micro: int) -> LayoutPlan:
    """`_least_recompute` of each `cp_impl_variants` profile: the fastest valid one (the first on a tie),
    saying why over the other; the profile's own when none is valid."""
    plans = [
        _least_recompute(variant, layout, workload, micro) for variant in cp_impl_variants(profile, layout)
    ]
    valid = [p for p in plans if p.valid]
    best = max(valid, key=lambda p: p.tokens_per_s_per_gpu) if valid else plans[0]
    for other in plans:
        if other is best:
            continue
        if not other.valid:
            why = f"{other.cp_impl} is refused: {other.problems[0]}"
        else:
            mine, theirs = (sum(c.bytes for c in p.comm if c.dim.startswith("cp")) for p in (best, other))
            why = (
                f"{other.cp_impl} predicts {other.tokens_per_s_per_gpu:,.0f} tokens/s/GPU "
                f"(cp traffic {theirs / 1e9:.3g} GB/step against {mine / 1e9:.3g})"
            )
        best.why.append(f"parallel.cp_impl={best.cp_impl}: {why}")
    return best


def divisors(n: int) -> list[int]:
    """The divisors of `n`, ascending (in sqrt(n) steps: a large world size must not stall the planner)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def candidate_layouts(profile: RunProfile, world: int) -> Iterator[tuple[Layout, int]]:
    """Every (pp, dp_replicate, dp_shard, cp, tp) whose product is `world`, with its micro-batch count:
    train.grad_accum, or at least 4 x pp with pipeline parallel (keeps the 1F1B bubble under 25%), and
    the profile's virtual stages (parallel.vpp) with pipeline parallel."""
    for tp in divisors(world):
        for cp in divisors(world // tp):
            for pp in divisors(world // (tp * cp)):
                rest = world // (tp * cp * pp)
                for dp_replicate in divisors(rest):
                    micro = max(profile.train.grad_accum, 4 * pp) if pp > 1 else profile.train.grad_accum
                    vpp = profile.parallel.vpp if pp > 1 else 1
                    yield Layout(pp, dp_replicate, rest // dp_replicate, cp, tp, vpp, micro), micro


@dataclass
class PlanReport:
    profile: str
    world_size: int
    workload: str
    ranked: list[LayoutPlan]
    rejected: list[LayoutPlan]
    families: list[str]
    """Per family of layouts (FSDP only, + CP, + TP, + PP): its best, or why none fits."""

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "world_size": self.world_size,
            "workload": self.workload,
            "families": self.families,
            "ranked": [p.as_dict() for p in self.ranked[:top]],
            "rejected": [{"layout": p.layout.degrees(), "problems": p.problems} for p in self.rejected],
        }


def _family(layout: Layout) -> str:
    parts = [name for name, d in (("CP", layout.cp), ("TP", layout.tp), ("PP", layout.pp)) if d > 1]
    return "FSDP/HSDP only" if not parts else "FSDP + " + " + ".join(parts)


def rank_layouts(profile: RunProfile, world_size: int | None = None) -> PlanReport:
    """Every layout of `world_size` ranks (default: the cluster's), valid ones ranked fastest first."""
    world = world_size or profile.cluster.world_size
    workload = Workload.from_profile(profile)
    ranked, rejected = [], []
    for layout, micro in candidate_layouts(profile, world):
        plan = _best_cp_impl(profile, layout, workload, micro)
        (ranked if plan.valid else rejected).append(plan)
    ranked.sort(key=lambda p: -p.tokens_per_s_per_gpu)
    families = []
    for family in (
        "FSDP/HSDP only",
        "FSDP + CP",
        "FSDP + TP",
        "FSDP + CP + TP",
        "FSDP + PP",
        "FSDP + CP + PP",
        "FSDP + TP + PP",
        "FSDP + CP + TP + PP",
    ):
        best = next((p for p in ranked if _family(p.layout) == family), None)
        if best is not None:
            families.append(
                f"{family}: best {best.name}, {best.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
                f"{best.memory.total / GIB:.1f} GiB ({best.checkpointing} checkpointing)"  # type: ignore[union-attr]
            )
            continue
        tried = [p for p in rejected if _family(p.layout) == family]
        if not tried:
            continue
        fits = [p for p in tried if p.memory is not None]
        if fits:
            least = min(fits, key=lambda p: p.memory.total)  # type: ignore[union-attr]
            families.append(f"{family}: none fits; the smallest ({least.name}) {least.problems[0]}")
        else:
            families.append(f"{family}: none valid; e.g. {tried[0].name}: {tried[0].problems[0]}")
    return PlanReport(profile.name, world, workload.describe(), ranked, rejected, families)


def format_plan(plan: LayoutPlan, profile: RunProfile) -> str:
    """The memory breakdown, communication and step-time prediction of one layout, for a reader."""
    lay = plan.layout
    lines = [
        f"layout {plan.name} = {lay.describe()} on {lay.world_size} rank(s); model {profile.model.preset or 'custom'}, "
        f"{profile.train.precision}, {plan.checkpointing} activation checkpointing, {plan.microbatches} micro-batch(es)/step",
        f"workload per data-parallel rank and micro-batch: {Workload.from_profile(profile).describe()}",
    ]
    if plan.memory is None:
        return "\n".join([*lines, *(f"invalid: {p}" for p in plan.problems)])
    lines.append("")
    lines.append(
        f"memory per rank ({profile.cluster.accelerator.name}, {profile.cluster.accelerator.memory_gib:g} GiB):"
    )
    for term in plan.memory.terms:
        lines.append(f"  {term.name:<22} {term.bytes / GIB:9.2f} GiB   {term.formula}")
    lines.append(
        f"  {'total':<22} {plan.memory.total / GIB:9.2f} GiB   (plan limit {plan.capacity_bytes / GIB:.0f} GiB)"
    )
    lines.extend(f"  note: {n}" for n in plan.memory.notes)
    lines.append("")
    lines.append("communication per rank and step:")
    if not plan.comm:
        lines.append("  none (one rank)")
    for c in plan.comm:
        tag = "overlapped" if c.overlapped else "exposed"
        lines.append(
            f"  {c.dim:<16} {c.bytes / 1e9:9.3g} GB  {c.link} {c.bandwidth_gbs:g} GB/s -> {c.seconds:.3g} s ({tag})   {c.formula}"
        )
    lines.append("")
    rate, source = achievable_mfu(profile)
    lines.append(
        f"predicted step: {plan.step_s:.3g} s (compute {plan.compute_s:.3g} s at {rate:.0%} of "
        f"{profile.cluster.accelerator.peak_bf16_flops / 1e12:g} TFLOP/s"
        + (f", bubble {plan.bubble_s:.3g} s" if plan.bubble_s else "")
        + f"); {plan.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
    )
    lines.append(f"  step time's rate: {source}")
    sparse = next(
        (f for f in ("attention_window", "attention_topk") if getattr(profile.model, f) is not None), None
    )
    if sparse is not None:
        workload = Workload.from_profile(profile)
        full = forward_flops(profile.model.model_copy(update={sparse: None}), [workload.grid], 0)
        skipped = forward_flops(profile.model, [workload.grid], 0).skipped_attention
        name = "sliding-tile" if sparse == "attention_window" else "video sparse"
        lines.append(
            f"{name} attention (model.{sparse}) skips {skipped / full.parts['attention']:.0%} of "
            f"self-attention's FLOPs per sample ({3 * skipped / 1e12:.3g} TFLOP a training step); not in the compute above"
        )
    lines.extend(f"invalid: {p}" for p in plan.problems)
    return "\n".join(lines)


def format_ranking(report: PlanReport, top: int = 10) -> str:
    lines = [
        f"{len(report.ranked)} valid layouts of {report.world_size} ranks for {report.profile} "
        f"({report.workload}); {len(report.rejected)} rejected. Fastest first:",
        f"{'#':>3}  {'pp':>3} {'dp_rep':>6} {'dp_shard':>8} {'cp':>3} {'tp':>3}  {'ckpt':<9} {'GiB':>6} "
        f"{'step s':>7} {'tok/s/GPU':>10} {'batch':>6}",
    ]
    for i, (p, alike) in enumerate(distinct(report.ranked)[:top], 1):
        lay = p.layout
        lines.append(
            f"{i:>3}  {lay.pp:>3} {lay.dp_replicate:>6} {lay.dp_shard:>8} {lay.cp:>3} {lay.tp:>3}  "
            f"{p.checkpointing:<9} {p.memory.total / GIB:>6.1f} {p.step_s:>7.3g} {p.tokens_per_s_per_gpu:>10,.0f} "  # type: ignore[union-attr]
            f"{p.clips_per_step:>6}"
            + (
                f"  (also dp_replicate {', '.join(str(a.layout.dp_replicate) for a in alike)}: more memory)"
                if alike
                else ""
            )
        )
    if report.ranked:
        lines.append("")
        lines.append(f"why #1 ({report.ranked[0].name}):")
        lines.extend(f"  {w}" for w in report.ranked[0].why)
    lines.append("")
    lines.append("by family of layouts:")
    lines.extend(f"  {f}" for f in report.families)
    reasons: dict[str, int] = {}
    for p in report.rejected:
        first = p.problems[0] if p.problems else "?"
        if first.startswith("needs "):
            key = "does not fit in memory (with full activation checkpointing)"
        else:  # the first clause of the rule's sentence, its numbers as N
            key = re.sub(r"\d[\d,.]*", "N", first.split("; ")[0])
        reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        lines.append("")
        lines.append("rejected:")
        lines.extend(f"  {n:>4} x {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
    return "\n".join(lines)


def distinct(ranked: list[LayoutPlan]) -> list[tuple[LayoutPlan, list[LayoutPlan]]]:
    """The ranking without rows that predict the same: layouts that differ only in how the data-parallel
    ranks split between replicas and shards (same pp, cp, tp, checkpointing, step time, batch) are one
    row, the one with the least memory, listing the others."""
    groups: dict[tuple, list[LayoutPlan]] = {}
    for p in ranked:
        lay = p.layout
        key = (
            lay.pp,
            lay.cp,
            lay.tp,
            lay.dp,
            p.checkpointing,
            p.cp_impl,
            round(p.step_s, 6),
            p.clips_per_step,
        )
        groups.setdefault(key, []).append(p)
    out = []
    for group in groups.values():
        group.sort(key=lambda p: p.memory.total if p.memory else math.inf)
        out.append((group[0], group[1:]))
    return out


def cp_choices(cp: int) -> list[tuple[str, int]]:
    """The context-parallel implementations of full attention for a cp degree, as (cp_impl, cp_ulysses):
    the 1D ones, and usp with every Ulysses degree that divides cp strictly between 1 and cp (the two
    ends are ring and ulysses)."""
    return [("all-gather", 1), ("ring", 1), ("ulysses", 1)] + [("usp", u) for u in divisors(cp)[1:-1]]


def rank_cp_impls(
    profile: RunProfile, layout: Layout | None = None, checkpointing: str | None = None
) -> list[tuple[str, LayoutPlan]]:
    """A layout's (default: the profile's) context-parallel implementations, each evaluated like
    `evaluate` with the profile otherwise unchanged: (name, plan) pairs, valid ones fastest first, then
    the ones the rulebook refuses or memory does not hold. Names are `parallel.cp_impl` values, usp with
    its Ulysses degree (`usp 8x2` is cp_ulysses 8, a ring of 2)."""
    layout = layout or profile.layout
    out = []
    # an ST-DiT's spatial and temporal attention need one of its own sequence parallels
    stdit = profile.model.architecture == "stdit"
    for impl, ulysses in [(i, 1) for i in ST_CP_IMPLS] if stdit else cp_choices(layout.cp):
        parallel = profile.parallel.model_copy(update={"cp_impl": impl, "cp_ulysses": ulysses})
        plan = evaluate(profile.model_copy(update={"parallel": parallel}), layout, checkpointing)
        out.append((f"usp {ulysses}x{layout.cp // ulysses}" if impl == "usp" else impl, plan))
    return sorted(out, key=lambda pair: (not pair[1].valid, -pair[1].tokens_per_s_per_gpu))


def format_cp_choices(choices: list[tuple[str, LayoutPlan]]) -> str:
    """`rank_cp_impls`'s answer for a reader: one line per implementation, fastest first."""
    lines = ["context parallel, by implementation (fastest first):"]
    for name, plan in choices:
        if not plan.valid:
            lines.append(f"  {name:<12} invalid: {plan.problems[0]}")
            continue
        cp = ", ".join(
            f"{c.dim} {c.seconds:.3g} s{' (overlapped)' if c.overlapped else ''} over {c.link}"
            for c in plan.comm
            if c.dim.startswith("cp")
        )
        lines.append(
            f"  {name:<12} step {plan.step_s:.3g} s, {plan.tokens_per_s_per_gpu:,.0f} tokens/s/GPU; {cp}"
        )
    return "\n".join(lines)
