"""The checks that span sections, run where a profile loads (`loading.validate_profile`): the layout
rulebook (`layout_rules`) on the profile and on the profile each stage of a curriculum trains with
(`apply_stage`). Above the profile's sections, which know nothing of them."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from vidforge.profile.experts import expert_problems
from vidforge.profile.layout_rules import layout_problems
from vidforge.profile.run_profile import RunProfile
from vidforge.profile.stages import Stage


def profile_problems(profile: RunProfile) -> list[str]:
    """Every `field: what is wrong; what to change` of the profile's layout, and of each stage's."""
    return layout_problems(profile) + expert_problems(profile) + stage_problems(profile)


def apply_stage(profile: RunProfile, stage: Stage) -> RunProfile:
    """The RunProfile one stage trains with: the profile with the stage's fields set and no stages.
    Raises pydantic's ValidationError where a section refuses the stage's values."""
    update: dict[str, Any] = {"stages": []}
    for section, fields in stage.overrides().items():
        current = getattr(profile, section)
        update[section] = type(current).model_validate({**current.model_dump(), **fields})
    return profile.model_copy(update=update)


def stage_problems(profile: RunProfile) -> list[str]:
    """What is wrong with each stage's resulting profile (section checks, the layout rulebook and the
    expert checks), as `stages: in stage 'NAME', field: message`."""
    problems: list[str] = []
    names = [stage.name for stage in profile.stages]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        problems.append(f"stages: each stage needs its own name; {', '.join(repeated)} repeats")
    for stage in profile.stages:
        try:
            staged = apply_stage(profile, stage)
            found = layout_problems(staged) + expert_problems(staged)  # a stage may name an expert
        except ValidationError as err:  # raised by the section the stage's values went into
            found = [_describe(err.title.lower(), e) for e in err.errors(include_url=False)]
        problems += [f"stages: in stage {stage.name!r}, {p}" for p in found]
    return problems


def _describe(section: str, error: dict[str, Any]) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    where = ".".join(str(p) for p in error["loc"])
    return f"{section}.{where}: {message}" if where else f"{section}.{message}"
