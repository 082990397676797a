"""Global options (`--json`, `--quiet`, `--debug`) in either place: `vidforge --json clip ...` and
`vidforge clip ... --json` mean the same. click only parses a group's options before its subcommand, so
the root group moves them to the front before parsing. None of them takes a value and no subcommand has
an option of the same name; `--` ends the options (what follows it is left alone)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import typer
from typer.core import TyperArgument, TyperGroup

from vidforge.cli._errors import GuardedGroup

if TYPE_CHECKING:
    import click  # the annotation only: typer carries its own copy of click, which is the one used

GLOBAL_FLAGS = frozenset({"--json", "--quiet", "-q", "--debug"})
COMMAND_KEY = "vidforge.command"


def hoist_global_flags(args: list[str]) -> list[str]:
    front: list[str] = []
    rest: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            rest += args[i:]
            break
        (front if arg in GLOBAL_FLAGS else rest).append(arg)
    return front + rest


def command_path(group: TyperGroup, args: list[str]) -> str:
    """The subcommand's name as typed ("train", "bench train"): the first word, and the next one when
    the first names a group and the next one of its commands (`tokenize SRC` runs tokenize's default)."""
    words = [arg for arg in args if not arg.startswith("-")]
    if not words:
        return ""
    sub = group.commands.get(words[0])
    if isinstance(sub, TyperGroup) and len(words) > 1 and words[1] in sub.commands:
        return f"{words[0]} {words[1]}"
    return words[0]


def reflow(text: str | None) -> str | None:
    """A docstring's paragraphs as one line each, so the terminal wraps them at its width (typer keeps a
    docstring's line breaks, and a 110-column line broke in two at 80 columns). A line that starts with
    `Example:`, `-` or an indent stays a line of its own."""
    if not text:
        return text
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            own = not lines or line.startswith(("Example:", "-", " ", "\b"))
            if own:
                lines.append(line)
            else:
                lines[-1] += " " + line.strip()
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


class _Argument(TyperArgument):
    """A positional argument as usage lines have always shown one: `VIDEOS`, `[RUN]`, `INPUTS...` (typer
    writes `{videos}` for a required one)."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _reflow_tree(command: click.Command) -> None:
    command.help = reflow(command.help)
    for param in command.params:
        if isinstance(param, TyperArgument):
            param.metavar = param.metavar or (param.name or "").upper()
            param.__class__ = _Argument  # the same object, its usage piece click-style
    for sub in getattr(command, "commands", {}).values():
        _reflow_tree(sub)


class RootGroup(GuardedGroup):
    """`vidforge`: the error boundary (GuardedGroup), with global options accepted after the subcommand,
    and every command's help reflowed (`reflow`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _reflow_tree(self)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        args = hoist_global_flags(list(args))
        ctx.meta[COMMAND_KEY] = command_path(self, args)
        return super().parse_args(ctx, args)
