"""`vidforge profile show|validate|schema|list`: inspect run-profiles without running anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import current_output
from vidforge.profile import ProfileError, RunProfile, dump_profile, load_profile
from vidforge.profile.loading import shipped_profiles

app = typer.Typer(
    help="Inspect and check run-profiles (the YAML every stage reads).\n\n"
    "Example: vidforge profile validate --profile profiles/dit7b_74k_tp2_cp4_64xh100.yaml",
    no_args_is_help=True,
)


@app.command()
def show(profile: ProfileOpt = None, set_: SetOpt = None) -> None:
    """Print the resolved profile as YAML, overrides applied and presets expanded.

    Example: vidforge profile show --profile dit1b_1xh200 --set parallel.tp=2
    """
    resolved = profile_from(profile, set_)
    out = current_output()
    if out.json:
        out.result(resolved.model_dump(mode="json"))
    else:
        out.result({}, text=dump_profile(resolved).rstrip())


@app.command()
def validate(
    paths: Annotated[list[Path] | None, typer.Argument(help="Profiles to check; default: --profile.")] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Check profiles: schema, layout product = world size, divisibility by heads and layers.

    Example: vidforge profile validate profiles/*.yaml
    """
    out = current_output()
    targets: list[str | None] = [str(p) for p in paths] if paths else [profile]
    failures = []
    for target in targets:
        try:
            resolved = profile_from(target, set_)
        except ProfileError as err:
            if len(targets) == 1:
                raise
            failures.append(str(err))
            out.error(str(err), kind="user")
            continue
        out.result(
            _summary(resolved, target), text=f"ok  {resolved.name}: {_summary(resolved, target)['layout']}"
        )
    if failures:
        raise ProfileError(f"{len(failures)} of {len(targets)} profiles are invalid (see above)")


def _summary(profile: RunProfile, source: str | None) -> dict:
    layout = profile.layout
    return {
        "profile": profile.name,
        "source": source or "default",
        "world_size": layout.world_size,
        "layout": f"{layout.describe()} on {layout.world_size} rank(s), model {profile.model.preset or 'custom'}",
        **layout.degrees(),
    }


@app.command()
def schema() -> None:
    """Print the JSON Schema of the run-profile (every field with its description).

    Example: vidforge profile schema > run_profile.schema.json
    """
    current_output().result(
        RunProfile.model_json_schema(), text=json.dumps(RunProfile.model_json_schema(), indent=2)
    )


@app.command("list")
def list_() -> None:
    """List the shipped profiles (and any in ./profiles) with their layouts.

    Example: vidforge profile list
    Example: vidforge --json profile list
    """
    out = current_output()
    rows = []
    paths = shipped_profiles()
    for done, path in enumerate(paths, 1):
        resolved = load_profile(path)
        layout = resolved.layout
        rows.append((path.stem, resolved.model.preset or "custom", layout.describe(), layout.world_size))
        out.progress(
            "profile",
            done,
            len(paths),
            name=path.stem,
            layout=layout.describe(),
            world_size=layout.world_size,
        )
    out.table(rows, columns=("profile", "model", "layout", "ranks"))
