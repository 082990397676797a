"""The objectives and samplers there are, one entry each: what the profile's validator accepts
(`diffusion.objective`, `diffusion.sampler`, which sampler goes with which objective, who takes
`diffusion.churn`), what `diffusion.from_profile.sample` runs for `vidforge infer`, `bench infer` and
training's validation samples, and what the CLI's help names.

Plain data without torch: the profile reads it while it loads, so an impossible pair is refused in one
line (exit 2) before any model code is imported. An objective's builder and schedule, and a sampler's
function, are named by their import paths and imported only when they run (the one table of both:
`diffusion.from_profile` looks them up here).

A new sampler is a function `(denoise, noise, levels, **options) -> sample` beside its objective's
others (`levels`: the objective's schedule, decreasing and ending at 0; `denoise(x, level)` the clean
estimate) and one `Sampler` line here; its summary is what the profile's schema says of it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _load(path: str) -> Callable[..., Any]:
    module, function = path.split(":")
    return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class Objective:
    name: str
    """`diffusion.objective`."""
    title: str
    """What the help calls it."""
    summary: str
    """What it is, for the profile's documentation of `diffusion.objective`."""
    build: str
    """`module:function`, imported when building: `(diffusion section) -> Objective`, with its settings."""
    levels: str
    """`module:function`: `(diffusion section) -> (steps + 1,)` its sampling schedule, decreasing levels
    ending at 0, what its samplers step over."""

    def load_build(self) -> Callable[..., Any]:
        return _load(self.build)

    def load_levels(self) -> Callable[..., Any]:
        return _load(self.levels)


@dataclass(frozen=True)
class Sampler:
    name: str
    """`diffusion.sampler`."""
    objective: str | None
    """The objective it inverts: it steps over that objective's schedule (EDM: Karras sigmas; flow:
    shifted flow times). None: either (a distilled student's sampler, over its own levels)."""
    function: str
    """`module:function`, imported when sampling: `(denoise, noise, levels, **options) -> sample`."""
    summary: str
    """What it is, for the profile's documentation of `diffusion.sampler`."""
    stochastic: bool = False
    """It takes `diffusion.churn` (options `churn` and `generator`); the others are deterministic and
    refuse churn > 0."""
    student: bool = False
    """A distilled student's (`train.distill` writes it into the run's profile): it steps over
    `diffusion.few_step_levels`, not the objective's schedule, and is called `(denoise, noise, levels,
    objective, draw, renoise)`: the built objective re-noises each clean estimate with `draw(like)`'s
    noise or the noise its input implies (`diffusion.few_step_noise`)."""

    def load(self) -> Callable[..., Any]:
        return _load(self.function)


OBJECTIVES: tuple[Objective, ...] = (
    Objective(
        "edm",
        "EDM",
        "Karras et al. (2022), a preconditioned denoiser trained at log-normal noise levels sigma",
        "vidforge.diffusion.from_profile:edm_objective",
        "vidforge.diffusion.from_profile:edm_levels",
    ),
    Objective(
        "flow",
        "rectified flow",
        "rectified flow (Wan2.1, SD3): x_t = (1 - t) x0 + t noise, the network predicts the velocity "
        "noise - x0, t drawn by `flow_time_sampling` and shifted by `flow_shift`",
        "vidforge.diffusion.from_profile:flow_objective",
        "vidforge.diffusion.from_profile:flow_levels",
    ),
)

FEW_STEP = "few-step"

# An objective's first sampler is its default.
SAMPLERS: tuple[Sampler, ...] = (
    Sampler(
        "heun",
        "edm",
        "vidforge.diffusion.samplers:heun_sampler",
        "2nd-order Heun (EDM's Algorithm 2), about two model calls per step",
        stochastic=True,
    ),
    Sampler(
        "res",
        "edm",
        "vidforge.diffusion.samplers:res_sampler",
        "RES 2nd-order multistep exponential integrator, one model call per step",
    ),
    Sampler(
        "unipc",
        "flow",
        "vidforge.diffusion.flow_samplers:unipc_sampler",
        "UniPC-bh2 at Wan's integer timesteps (Wan2.1's default)",
    ),
    Sampler(
        "flow-euler",
        "flow",
        "vidforge.diffusion.flow_samplers:flow_euler_sampler",
        "Euler on the flow ODE (diffusers' FlowMatchEulerDiscreteScheduler)",
    ),
    Sampler(
        FEW_STEP,
        None,
        "vidforge.diffusion.dmd:few_step_sampler",
        "a distilled student's sampler (one model call per level of `few_step_levels`, the clean estimate "
        "re-noised to the next level), which a `train.distill` run writes into its profile",
        student=True,
    ),
)

OBJECTIVE_NAMES: tuple[str, ...] = tuple(o.name for o in OBJECTIVES)
SAMPLER_NAMES: tuple[str, ...] = tuple(s.name for s in SAMPLERS)


def objective(name: str) -> Objective:
    """The entry of objective `name` (the profile has checked that it is one)."""
    return next(o for o in OBJECTIVES if o.name == name)


def sampler(name: str) -> Sampler:
    """The entry of sampler `name` (the profile has checked that it is one)."""
    return next(s for s in SAMPLERS if s.name == name)


def samplers_of(objective: str) -> tuple[str, ...]:
    """The samplers that invert `objective`, its default first (a student's, for either, not among them)."""
    return tuple(s.name for s in SAMPLERS if s.objective == objective)


def samplers_by_objective() -> str:
    """Every sampler under its objective, for help texts: "heun or res under EDM, unipc or flow-euler
    under rectified flow, few-step (a distilled student's) under either"."""
    named = [f"{' or '.join(samplers_of(o.name))} under {o.title}" for o in OBJECTIVES]
    students = [s.name for s in SAMPLERS if s.student]
    return ", ".join([*named, f"{' or '.join(students)} (a distilled student's) under either"])


def objective_titles() -> str:
    """The objectives by the help's names: "EDM or rectified flow"."""
    return " or ".join(o.title for o in OBJECTIVES)


def objectives_doc() -> str:
    """`diffusion.objective`'s documentation in the profile's schema."""
    return " ".join(f"`{o.name}`: {o.summary}." for o in OBJECTIVES)


def samplers_doc() -> str:
    """`diffusion.sampler`'s documentation in the profile's schema."""
    listed = " ".join(f"`{s.name}` ({s.objective or 'either'}): {s.summary}." for s in SAMPLERS)
    defaults = ", ".join(f"{samplers_of(o.name)[0]} for {o.name}" for o in OBJECTIVES)
    return f"{listed} Left out, it is the objective's first ({defaults})."
