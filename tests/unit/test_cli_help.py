"""Every command's help: an example (README promises one for each) and paragraphs that the terminal wraps
(typer keeps a docstring's line breaks: a long line broke in two at 80 columns)."""

from __future__ import annotations

import click
import typer
from typer.testing import CliRunner

from vidforge.cli._globals import reflow
from vidforge.cli.app import app


def _commands(command: click.Command, path: str = "vidforge") -> list[tuple[str, click.Command]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, f"{path} {name}")
    return found


def test_every_command_and_group_has_an_example() -> None:
    missing = [
        path
        for path, command in _commands(typer.main.get_command(app))[1:]
        if "Example:" not in (command.help or "")
    ]
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
