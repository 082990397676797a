"""Every command's `--help` agrees with the registry of samplers and objectives
(`vidforge.sampler_registry`, which the profile's validator and `diffusion.from_profile` read): a
sampler it names exists, prose that names some samplers (or objectives) names all of them, and a
sampler named "under" an objective samples that objective, so a help text cannot say "the EDM loss" or
"heun|res" once flow is there too. Every command has an example
(README promises one for each), and help paragraphs wrap at the terminal's width (typer keeps a
docstring's line breaks: a long line broke in two at 80 columns)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from vidforge import sampler_registry
from vidforge.cli._globals import reflow
from vidforge.cli.app import app
from vidforge.diffusion.edm import EDM
from vidforge.diffusion.flow import RectifiedFlow
from vidforge.diffusion.from_profile import build_objective
from vidforge.profile.diffusion import Diffusion

SAMPLERS = sampler_registry.SAMPLER_NAMES
OBJECTIVE_NAMES = sampler_registry.OBJECTIVE_NAMES
runner = CliRunner()


def _commands(command=None, path=()):
    command = command or typer.main.get_command(app)
    yield " ".join(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


def _named(words, text: str) -> set[str]:
    return {w for w in words if re.search(rf"(?<![\w.-]){re.escape(w)}(?![\w-])", text, re.IGNORECASE)}


def _help(path: str) -> str:
    result = runner.invoke(app, [*path.split(), "--help"], terminal_width=300)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_profile_takes_the_registry_and_builds_every_objective_of_it():
    built = {"edm": EDM, "flow": RectifiedFlow}  # the objectives' own classes, by name
    assert set(OBJECTIVE_NAMES) == set(built)
    for entry in sampler_registry.OBJECTIVES:  # the one table: its builder and schedule import and run
        assert isinstance(build_objective(Diffusion(objective=entry.name)), built[entry.name])
        levels = entry.load_levels()(Diffusion(objective=entry.name, steps=5))
        assert levels.shape == (6,) and levels[-1] == 0 and bool((levels[:-1] > levels[1:]).all())
    for objective in OBJECTIVE_NAMES:
        fits = sampler_registry.samplers_of(objective)
        assert Diffusion(objective=objective).sampler == fits[0]
        for name in fits:
            assert callable(sampler_registry.sampler(name).load())
            assert Diffusion(objective=objective, sampler=name).sampler == name
        students = {
            s.name for s in sampler_registry.SAMPLERS if s.student
        }  # either objective, over their own levels
        for other in set(SAMPLERS) - set(fits) - students:
            with pytest.raises(ValueError, match=f"{other} does not sample the {objective} objective"):
                Diffusion(objective=objective, sampler=other)


@pytest.mark.parametrize("path", ["infer", "bench infer", "train"])
def test_help_that_lists_samplers_or_objectives_lists_the_registry(path):
    """The commands that name samplers (or objectives) name every one, each under its own objective."""
    text = " ".join(_help(path).split())
    under = re.findall(r"((?:[\w-]+ or )*[\w-]+) under ([A-Za-z ]+?)(?=[,;)])", text)
    titles = {o.title: o.name for o in sampler_registry.OBJECTIVES}
    paired = {(s, titles[title]) for names, title in under if title in titles for s in names.split(" or ")}
    if path == "train":
        assert f"diffusion.objective: {' or '.join(titles)}" in text
    else:
        assert paired == {(s.name, s.objective) for s in sampler_registry.SAMPLERS if s.objective}, under
        for student in (s.name for s in sampler_registry.SAMPLERS if s.objective is None):
            assert f"{student} (a distilled student's) under either" in text


@pytest.mark.parametrize("path", [pytest.param(p, id=p or "vidforge") for p in COMMANDS])
def test_help_names_the_samplers_and_objectives_there_are(path):
    text = _help(path)
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


def test_every_command_and_group_has_an_example():
    missing = [p for p in COMMANDS[1:] if "Example:" not in runner.invoke(app, [*p.split(), "--help"]).output]
    assert missing == []


def test_reflow_joins_a_paragraphs_lines_and_keeps_examples_and_lists() -> None:
    text = "First line\n    goes on.\n\n    Second paragraph\n    ends.\n    - a list item\n    Example: vidforge x\n    Example: vidforge y"
    assert (
        reflow(text)
        == "First line goes on.\n\nSecond paragraph ends.\n- a list item\nExample: vidforge x\nExample: vidforge y"
    )


def test_help_at_80_columns_breaks_only_where_the_terminal_ends() -> None:
    result = CliRunner().invoke(app, ["caption", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    lines = [line.strip() for line in result.stdout.splitlines()]
    # the sidecar paragraph: each of its lines but the last fills the width (no docstring break inside)
    start = next(i for i, line in enumerate(lines) if line.startswith("Captions that came with the videos"))
    end = lines.index("", start)
    assert all(len(line) > 40 for line in lines[start : end - 1]), lines[start:end]  # was "row" alone
