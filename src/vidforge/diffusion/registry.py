"""The objectives and samplers there are, one entry each: what the profile's validator accepts
(`diffusion.objective`, `diffusion.sampler`, which sampler goes with which objective, who takes
`diffusion.churn`), what `diffusion.from_profile.sample` runs for `vidforge infer`, `bench infer` and
training's validation samples, and what the CLI's help names.

Plain data without torch: the profile reads it while it loads, so an impossible pair is refused in one
line (exit 2) before any model code is imported. A sampler's function is named by its import path and
imported only when it samples.

A new sampler is a function `(denoise, noise, levels, **options) -> sample` beside its objective's
others (`levels`: the objective's schedule, decreasing and ending at 0; `denoise(x, level)` the clean
estimate) and one `Sampler` line here."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Objective:
    name: str
    """`diffusion.objective`."""
    title: str
    """What the help calls it."""


@dataclass(frozen=True)
class Sampler:
    name: str
    """`diffusion.sampler`."""
    objective: str
    """The objective it inverts: it steps over that objective's schedule (EDM: Karras sigmas; flow:
    shifted flow times)."""
    function: str
    """`module:function`, imported when sampling: `(denoise, noise, levels, **options) -> sample`."""
    stochastic: bool = False
    """It takes `diffusion.churn` (options `churn` and `generator`); the others are deterministic and
    refuse churn > 0."""

    def load(self) -> Callable[..., Any]:
        module, function = self.function.split(":")
        return getattr(importlib.import_module(module), function)


OBJECTIVES: tuple[Objective, ...] = (
    Objective("edm", "EDM"),
    Objective("flow", "rectified flow"),
)

# An objective's first sampler is its default.
SAMPLERS: tuple[Sampler, ...] = (
    Sampler("heun", "edm", "vidforge.diffusion.samplers:heun_sampler", stochastic=True),
    Sampler("res", "edm", "vidforge.diffusion.samplers:res_sampler"),
    Sampler("unipc", "flow", "vidforge.diffusion.flow_samplers:unipc_sampler"),
    Sampler("flow-euler", "flow", "vidforge.diffusion.flow_samplers:flow_euler_sampler"),
)

OBJECTIVE_NAMES: tuple[str, ...] = tuple(o.name for o in OBJECTIVES)
SAMPLER_NAMES: tuple[str, ...] = tuple(s.name for s in SAMPLERS)


def sampler(name: str) -> Sampler:
    """The entry of sampler `name` (the profile has checked that it is one)."""
    return next(s for s in SAMPLERS if s.name == name)


def samplers_of(objective: str) -> tuple[str, ...]:
    """The samplers that invert `objective`, its default first."""
    return tuple(s.name for s in SAMPLERS if s.objective == objective)


def samplers_by_objective() -> str:
    """Every sampler under its objective, for help texts: "heun or res under EDM, unipc or flow-euler
    under rectified flow"."""
    return ", ".join(f"{' or '.join(samplers_of(o.name))} under {o.title}" for o in OBJECTIVES)


def objective_titles() -> str:
    """The objectives by the help's names: "EDM or rectified flow"."""
    return " or ".join(o.title for o in OBJECTIVES)
