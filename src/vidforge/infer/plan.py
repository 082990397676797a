"""How several ranks share sampling (`InferPlan`): tensor-parallel groups, CFG-parallel halves and the
sequence split, checked against the layout rulebook before anything loads, and the sampler function
that runs the model as the plan says."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vidforge.errors import UserInputError
from vidforge.parallel.scalefusion import ScaleFusionSlicing
from vidforge.profile import RunProfile
from vidforge.profile.layout_rules import frame_split_fits, position_split_fits, sampling_layout_problems
from vidforge.profile.parallel import Layout, Parallel
from vidforge.sampling.latents import sample_latents


@dataclass(frozen=True)
class InferPlan:
    """How `world` ranks share sampling: `tp` tensor-parallel ranks (infer.tp) x `cfg` guidance branches
    (1 or 2) x `sp` sequence ranks; the sequence-parallel method (`scalefusion`, `context-parallel` or
    None for sp = 1) and, for context parallel, its `cp_impl`."""

    world: int
    cfg: int
    sp: int
    method: str | None
    tp: int = 1
    cp_impl: str | None = None

    @classmethod
    def choose(
        cls, world: int, guidance: float, config, tp: int = 1, cp_impl: str = "all-gather"
    ) -> InferPlan:
        """The plan for `world` ranks; `cp_impl` is the profile's parallel.cp_impl (an ST-DiT's attention
        is not full attention: its sequence split is ScaleFusion or st-hybrid whatever the profile says)."""
        if world % tp:
            raise UserInputError(
                f"infer.tp: {tp} does not divide --nproc {world} (the model is held by groups of infer.tp "
                "ranks); change infer.tp or --nproc"
            )
        groups = world // tp
        stdit = config.architecture == "stdit"
        # An ST-DiT slices by positions when the profile says st-spatial (any frame count), else by frames:
        # ScaleFusion for the sequential block, st-hybrid for the parallel one.
        spatial = stdit and cp_impl == "st-spatial"
        scalefusion = stdit and config.stdit_block == "sequential" and not spatial
        cfg = 2 if guidance != 1.0 and groups % 2 == 0 else 1
        sp = groups // cfg
        method = None if sp == 1 else ("scalefusion" if scalefusion else "context-parallel")
        impl = None
        if method == "context-parallel":
            impl = cp_impl if spatial or not stdit else "st-hybrid"
        return cls(world, cfg, sp, method, tp, impl)

    def layout(self) -> Layout:
        """The plan as a mesh layout: the guidance pair holds the same weights and tokens, as data-parallel
        replicas do, so it takes the dp_replicate dimension; the sequence ranks cp; tp innermost, as in
        training (the fastest links)."""
        return Layout(pp=1, dp_replicate=self.cfg, dp_shard=1, cp=self.sp, tp=self.tp)

    def describe(self) -> str:
        names = {"scalefusion": "ScaleFusion sequence parallel", "context-parallel": "context parallel"}
        sequence = f"{names[self.method]} x{self.sp}" if self.method else ""
        # all-gather is a DiT's default and st-hybrid an ST-DiT's only method: named when the profile chose
        if self.cp_impl not in (None, "all-gather", "st-hybrid"):
            sequence += f" ({self.cp_impl})"
        parts = (
            ([f"tensor parallel x{self.tp}"] if self.tp > 1 else [])
            + (["CFG-parallel x2"] if self.cfg == 2 else [])
            + ([sequence] if sequence else [])
        )
        return " and ".join(parts) or "one rank"


def sampling_parallel(profile: RunProfile, plan: InferPlan) -> Parallel:
    """The profile's parallel section with the plan's cp_impl (st-hybrid for an ST-DiT)."""
    return profile.parallel.model_copy(update={"cp_impl": plan.cp_impl or profile.parallel.cp_impl})


def check_plan(plan: InferPlan, profile: RunProfile, lora: object = None) -> None:
    """Refuse a plan the model cannot be sampled with, in one line saying what to change: the layout
    rulebook's model rules (heads over tp, and over tp x cp for Ulysses; the multimodal block), and what
    tensor-parallel sampling does not combine with."""
    where = f"--nproc {plan.world} ({plan.describe()})"
    if plan.tp > 1 and plan.method == "scalefusion":
        raise UserInputError(
            f"infer.tp: {where}: ScaleFusion (the sequential ST-DiT's sequence split) has no tensor-parallel "
            f"path; set infer.tp=1, or use --nproc {plan.tp * plan.cfg} so the sequence is not split"
        )
    if plan.tp > 1 and lora is not None:
        raise UserInputError(
            f"--lora: LoRA adapters have no tensor-parallel plan (infer.tp={plan.tp}); set infer.tp=1"
        )
    used = profile.model_copy(update={"parallel": sampling_parallel(profile, plan)})
    problems = sampling_layout_problems(used, plan.layout())
    if problems:  # the rulebook names the training fields; sampling's tp and cp come from these
        problem = problems[0].replace("parallel.tp", "infer.tp")
        if problem.startswith("parallel.cp"):
            problem += (
                f" (sampling's cp is --nproc / (infer.tp x guidance branches) = {plan.sp}: change --nproc)"
            )
        raise UserInputError(f"{where}: {problem}")


def check_sequence_split(plan: InferPlan, config, latent_shape: Sequence[int]) -> None:
    """The layout rulebook's sequence-split rules (`frame_split_fits` for ST-DiT's frame slicing, ScaleFusion
    and st-hybrid; `position_split_fits` for st-spatial) held to the token grid of infer's video size. A
    UserInputError saying what to change if it does not split."""
    if plan.sp == 1 or config.architecture != "stdit":
        return
    from vidforge.tokens import token_grid

    t, h, w = token_grid(tuple(latent_shape)[1:], config.patch)
    if plan.cp_impl == "st-spatial":
        if not position_split_fits(h * w, plan.sp):
            raise UserInputError(
                f"--nproc {plan.world}: {plan.describe()} gives each rank (h, w) positions of every frame, but "
                f"the token grid has {h * w} a frame; raise infer.height / infer.width or use another --nproc"
            )
        return
    if not (frame_split_fits(t, plan.sp) and frame_split_fits(h * w, plan.sp)):
        raise UserInputError(
            f"--nproc {plan.world}: {plan.describe()} splits the {t} x {h} x {w} token grid's frames (T={t}) and "
            f"positions (H*W={h * w}) over {plan.sp} ranks; change infer.frames, infer.height or infer.width so "
            f"both divide by {plan.sp}, or use another --nproc"
        )


Sampler = Callable[..., torch.Tensor]
"""(text, mask, seeds, latent_shape, negative) -> latents (B, C, T, H, W), the same on every rank."""


def parallel_sampler(
    model, prof: RunProfile, plan: InferPlan, device: str, slicing: ScaleFusionSlicing
) -> Sampler:
    """Make `model` (whole, on every rank) parallel as `plan` says, in place, and return the function that
    samples with it over the process groups built here (every rank calls both in the same order)."""
    from vidforge.parallel.dims import ParallelDims
    from vidforge.parallel.parallelize import apply_context_parallel, apply_tensor_parallel

    dims = ParallelDims(plan.layout(), torch.device(device).type)
    cfg_group = dims.mesh["dp_replicate"].get_group() if plan.cfg == 2 else None
    if plan.tp > 1:
        apply_tensor_parallel(model, dims, prof)
    if plan.method == "context-parallel":
        from vidforge.sampling.latents import sample_latents_cp

        apply_context_parallel(model, dims, sampling_parallel(prof, plan))
        cp_mesh = dims.mesh["cp"]

        def sampler(text, mask, seeds, shape, negative):
            return sample_latents_cp(
                model, prof, text, mask, seeds, shape, cp_mesh, negative, cfg_group=cfg_group
            )

        return sampler
    forward = None
    if plan.method == "scalefusion":
        from vidforge.parallel.scalefusion import scalefusion_network

        forward = scalefusion_network(model, dims.mesh["cp"].get_group(), slicing)

    def sampler(text, mask, seeds, shape, negative):
        return sample_latents(
            model, prof, text, mask, seeds, shape, negative, cfg_group=cfg_group, forward=forward
        )

    return sampler


def profile_slicing(prof: RunProfile) -> ScaleFusionSlicing:
    """ScaleFusion's N_T, N_S, L_T, L_S from the profile's infer.scalefusion_*."""
    cfg = prof.infer
    return ScaleFusionSlicing(
        cfg.scalefusion_slices_t,
        cfg.scalefusion_slices_s,
        cfg.scalefusion_lookahead_t,
        cfg.scalefusion_lookahead_s,
    )
