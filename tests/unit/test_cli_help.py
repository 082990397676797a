"""Every command's `--help` agrees with the registry of samplers and objectives (the profile's
`diffusion.sampler` and `diffusion.objective`, which the validator and `diffusion.from_profile` read): a
sampler it names exists, and prose that names some samplers (or objectives) names all of them, so a
help text cannot say "the EDM loss" or "heun|res" once flow is there too."""

from __future__ import annotations

import re
from typing import get_args

import pytest
import typer
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.diffusion.from_profile import OBJECTIVES
from vidforge.profile.diffusion import Diffusion

SAMPLERS = get_args(Diffusion.model_fields["sampler"].annotation)
OBJECTIVE_NAMES = get_args(Diffusion.model_fields["objective"].annotation)
runner = CliRunner()


def _commands(command=None, path=()):
    command = command or typer.main.get_command(app)
    yield " ".join(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


def _named(words, text: str) -> set[str]:
    return {w for w in words if re.search(rf"(?<![\w.-]){re.escape(w)}(?![\w-])", text, re.IGNORECASE)}


def test_the_objectives_of_the_profile_are_the_ones_built():
    assert set(OBJECTIVE_NAMES) == set(OBJECTIVES)


@pytest.mark.parametrize("path", [pytest.param(p, id=p or "vidforge") for p in COMMANDS])
def test_help_names_the_samplers_and_objectives_there_are(path):
    result = runner.invoke(app, [*path.split(), "--help"], terminal_width=300)
    assert result.exit_code == 0, result.output
    text = result.output
    for value in re.findall(r"(?:diffusion\.sampler=|--sampler )([\w-]+)", text):
        assert value in SAMPLERS, (path, value)
    choices = re.findall(r"<([\w|-]+)>", text)
    for listed in choices:  # an option's choices: the whole registry or none of it
        names = set(listed.split("|"))
        assert not names & set(SAMPLERS) or names == set(SAMPLERS), (path, listed)
    prose = "\n".join(line for line in text.splitlines() if "Example:" not in line)
    prose = re.sub(r"<[\w|-]+>", "", prose)
    samplers = _named(SAMPLERS, prose)
    assert not samplers or samplers == set(SAMPLERS), (path, sorted(samplers))
    for sampler in SAMPLERS:  # `flow-euler` names a sampler, not the flow objective
        prose = re.sub(re.escape(sampler), "", prose)
    objectives = _named(OBJECTIVE_NAMES, prose)
    assert not objectives or objectives == set(OBJECTIVE_NAMES), (path, sorted(objectives))
