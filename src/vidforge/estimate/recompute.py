"""`train.activation_checkpointing: auto`: per block, the least recompute that fits the card, chosen with
the memory model.

A block recomputes in full (keeps only its input), at op level (keeps its matmul and attention outputs,
recomputes the cheap ops between them) or not at all (`vidforge.memory_savers.activation_checkpoint`). Recompute
costs time: a full block's forward again (1), an op-level block's elementwise work (`OPS_RECOMPUTE_COST`
of that). Of the mixes of `f` full, `o` op-level and `n - f - o` kept blocks whose predicted memory fits
`cluster.accelerator.memory_gib x bench.memory_headroom`, auto takes the one of least cost `f + c x o`
(on a tie the fewer full blocks). The peer (diffusers' trainer) recomputes every block because it cannot
know what fits; the memory model is held to measured peaks (tests/unit/test_recompute_auto.py and the
GPU suite's recompute rows).

The choice is written back into the profile as `selective` with the two ratios (`checkpoint_ratio`,
`checkpoint_ops_ratio` = f / n and o / n), so everything downstream (the memory model, the FLOP count,
the wrappers, profile.yaml) reads one concrete mix."""

from __future__ import annotations

from dataclasses import dataclass

from vidforge.estimate.memory_model import GIB, estimate_memory
from vidforge.estimate.workload import Workload
from vidforge.memory_savers.activation_checkpoint import OPS_RECOMPUTE_COST
from vidforge.profile import RunProfile
from vidforge.profile.parallel import Layout


@dataclass(frozen=True)
class RecomputeChoice:
    """auto's pick for one rank's blocks, and what it is weighed against."""

    blocks: int
    full: int
    ops: int
    predicted_bytes: float
    """The memory model's peak of the step with this mix."""
    capacity_bytes: float
    fits: bool
    """False: not even full recompute fits (the mix is then all full, and the plan says it does not fit)."""
    uniform_bytes: dict[str, float]
    """The memory model's peak with every block full, ops (when the family has op level) and none."""

    @property
    def none(self) -> int:
        return self.blocks - self.full - self.ops

    @property
    def cost(self) -> float:
        """Recomputed forward time, in full blocks."""
        return self.full + OPS_RECOMPUTE_COST * self.ops

    def describe(self) -> str:
        mix = ", ".join(
            f"{count} {what}" for count, what in ((self.none, "kept"), (self.ops, "op-level"), (self.full, "full"))
            if count
        )  # fmt: skip
        each = ", ".join(f"{k} {v / GIB:.3g}" for k, v in self.uniform_bytes.items())
        verdict = "fits" if self.fits else "does not fit even with full recompute"
        return (
            f"auto recompute: {mix} of {self.blocks} blocks ({self.predicted_bytes / GIB:.3g} GiB of "
            f"{self.capacity_bytes / GIB:.3g} GiB, {verdict}; every block full/ops/none: {each} GiB)"
        )


def with_mix(profile: RunProfile, blocks: int, full: int, ops: int) -> RunProfile:
    """`profile` with `full` of `blocks` blocks recomputed in full and `ops` at op level (`selective`)."""
    mode = "none" if not full and not ops else "full" if full == blocks else "selective"
    train = profile.train.model_copy(
        update={
            "activation_checkpointing": mode,
            "checkpoint_ratio": full / blocks if blocks else 0.0,
            "checkpoint_ops_ratio": ops / blocks if blocks else 0.0,
        }
    )
    return profile.model_copy(update={"train": train})


def capacity_of(profile: RunProfile) -> float:
    """What auto fits within: the accelerator's memory x bench.memory_headroom (`bench plan`'s capacity)."""
    return profile.cluster.accelerator.memory_gib * GIB * profile.bench.memory_headroom


def choose_recompute(
    profile: RunProfile,
    layout: Layout | None = None,
    workload: Workload | None = None,
    capacity_bytes: float | None = None,
) -> RecomputeChoice:
    """The least recompute of one rank's blocks (`cfg.layers / pp`) that fits `capacity_bytes` (default:
    `capacity_of`). The memory model falls as blocks move from kept to op level to full, so for each count
    of full blocks the fewest op-level ones that fit are found by bisection (past the first: see below);
    the search stops once the full
    blocks alone cost more than the best mix found."""
    from vidforge.estimate.memory_model import op_level_block

    layout = layout or profile.layout
    workload = workload or Workload.from_profile(profile)
    capacity = capacity_of(profile) if capacity_bytes is None else capacity_bytes
    blocks = profile.model.layers // layout.pp
    has_ops = op_level_block(profile.model, 1, 1, 1, 2) is not None

    def peak(full: int, ops: int) -> float:
        return estimate_memory(with_mix(profile, blocks, full, ops), layout, workload).total

    uniform = {"full": peak(blocks, 0), **({"ops": peak(0, blocks)} if has_ops else {}), "none": peak(0, 0)}
    best: tuple[float, int, int, float] | None = None  # cost, full, ops, bytes
    for full in range(blocks + 1):
        if best is not None and full >= best[0]:
            break
        rest = blocks - full
        if not has_ops:
            if peak(full, 0) <= capacity:
                best = (full, full, 0, peak(full, 0))
            continue
        if peak(full, rest) > capacity:
            continue
        # the fewest op-level blocks that fit: none at all, or else by bisection over 1..rest (the first
        # recomputing block adds the backward's recompute workspace, so memory falls from one op-level
        # block on, not from none)
        hi = 0
        if peak(full, 0) > capacity:
            lo, hi = 1, rest  # hi fits, lo - 1 does not
            while lo < hi:
                mid = (lo + hi) // 2
                if peak(full, mid) <= capacity:
                    hi = mid
                else:
                    lo = mid + 1
        cost = full + OPS_RECOMPUTE_COST * hi
        if best is None or cost < best[0]:
            best = (cost, full, hi, peak(full, hi))
    if best is None:
        return RecomputeChoice(blocks, blocks, 0, uniform["full"], capacity, False, uniform)
    _, full, ops, size = best
    return RecomputeChoice(blocks, full, ops, size, capacity, True, uniform)


def resolve_auto(
    profile: RunProfile, layout: Layout | None = None, workload: Workload | None = None
) -> tuple[RunProfile, RecomputeChoice | None]:
    """`profile` with `train.activation_checkpointing: auto` replaced by `choose_recompute`'s mix, and the
    choice (None, and the profile as it is, for any other setting)."""
    if profile.train.activation_checkpointing != "auto":
        return profile, None
    choice = choose_recompute(profile, layout, workload)
    return with_mix(profile, choice.blocks, choice.full, choice.ops), choice
