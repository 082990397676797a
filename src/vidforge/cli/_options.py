"""Option types every stage shares, declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, ParamSpec, TypeVar

import typer

from vidforge import sampler_registry
from vidforge.profile import PROFILE_ENV, RunProfile, load_profile
from vidforge.profile.overrides import Override, as_overrides

P = ParamSpec("P")
R = TypeVar("R")

ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        envvar=PROFILE_ENV,
        help="Run-profile: a YAML path or a name in profiles/ (default: profiles/local_cpu.yaml, "
        "else the built-in local CPU profile).",
        show_default=False,
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a profile field, typed by the schema; repeatable. E.g. --set parallel.tp=2.",
        metavar="SECTION.FIELD=VALUE",
        show_default=False,
    ),
]


ShardsOutOpt = Annotated[
    str,
    typer.Option(
        "--out",
        "-o",
        help="Output folder or fsspec URL (s3://bucket/prefix: staged locally, uploaded, index last); "
        "a rerun skips complete shards.",
    ),
]
"""Where `shard` and `tokenize` write their shards."""

NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        min=1,
        help="Run as this many local processes (a one-node world of N ranks: CPUs, or one GPU each).",
        show_default=False,
    ),
]


def parse_sets(sets: list[str] | None) -> list[Override]:
    """The user's `--set` texts, read once into typed overrides (what every layer below takes)."""
    return as_overrides(sets or ())


def profile_from(
    profile: str | None, overrides: list[str] | list[Override] | None, nproc: int | None = None
) -> RunProfile:
    """The run-profile with the user's overrides (`--set` texts, or already typed), then `--nproc`'s
    world size (which wins)."""
    from vidforge.parallel.launch import nproc_overrides

    return load_profile(profile, [*as_overrides(overrides), *nproc_overrides(nproc)])


def names_from_the_registry(command: Callable[P, R]) -> Callable[P, R]:
    """A command whose docstring says `{samplers}` (every sampler under its objective) or `{objectives}`
    gets them from `vidforge.sampler_registry`, so its help names the samplers and objectives there
    are, all of them, wherever they are added."""
    doc = command.__doc__ or ""
    doc = doc.replace("{samplers}", sampler_registry.samplers_by_objective())
    command.__doc__ = doc.replace("{objectives}", sampler_registry.objective_titles())
    return command
