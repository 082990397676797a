"""Option types every stage shares, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from vidforge.profile import PROFILE_ENV, RunProfile, load_profile

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


def profile_from(profile: str | None, overrides: list[str] | None) -> RunProfile:
    return load_profile(profile, overrides or ())
