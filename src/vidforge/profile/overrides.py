"""A profile's fields set from outside its file. Inside vidforge a setting is typed: an `Override` (a
dotted field and the Python value it takes, so a path stays the string it is, `#` and quotes included), or
a mapping of dotted fields to values (what the families' data and a stage's defaults hold). Text is the
command line's alone: `--set SECTION.FIELD=VALUE` is read once into an `Override` (`parse_set`), and an
override or a whole command is written back as a shell reads it (`set_text`, `command_line`)."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from vidforge.errors import UserInputError


class ProfileError(UserInputError):
    """A profile the user must change. The message is one line: where, what, and what to do."""


@dataclass(frozen=True)
class Override:
    """`key` (a dotted field, `tokenizer.path`) takes `value`, a Python value the schema then checks."""

    key: str
    value: Any
    given: str | None = None
    """The `--set` text it was read from (what a refusal quotes back); None when code built it."""

    def __post_init__(self) -> None:
        if isinstance(self.value, os.PathLike):  # a path is its string, as the schema's fields hold it
            object.__setattr__(self, "value", os.fspath(self.value))

    def __str__(self) -> str:
        """As `--set` takes it: the user's own text, else `key=value` that `parse_set` reads back as is."""
        return self.given if self.given is not None else set_text(self)


Settings = Mapping[str, Any] | Iterable[Override | str]
"""What the profile's loaders take: a mapping of dotted fields to values, or overrides in order (a later
one of a field wins); a str among them is a `--set` as typed (the command line's, and tests')."""


def parse_set(text: str) -> Override:
    """`SECTION.FIELD=VALUE` as `--set` takes it. The value is read as YAML, so `3` is an int, `true` a bool,
    `[1,2,2]` a list, `'wan #2'` the string in its quotes; the schema then checks the type."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ProfileError(f"--set {text!r}: expected section.field=value, e.g. --set parallel.tp=2")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if "#" in raw and "#" not in yaml_value(value):  # YAML took ` #...` for a comment and dropped it
        fix = command_line("--set", set_text(Override(key, raw.strip())))
        raise ProfileError(
            f"--set {text!r}: YAML reads ' #' and what follows as a comment (the value would be {value!r}); "
            f"quote the value to keep it: {fix}"
        )
    return Override(key, value, text)


def as_overrides(settings: Settings | None) -> list[Override]:
    """`settings` (see `Settings`) as overrides, in order: the one place a `--set` text becomes typed."""
    if settings is None:
        return []
    if isinstance(settings, Mapping):
        return [Override(key, value) for key, value in settings.items()]
    return [item if isinstance(item, Override) else parse_set(item) for item in settings]


def yaml_value(value: Any) -> str:
    """`value` as the YAML that `parse_set` reads back to it (a string quoted where YAML would read it as
    another value or cut it: `wan #2`, `true`, `1e-4`, `a: b`)."""
    try:
        text = yaml.safe_dump(
            value, default_flow_style=True, width=2**31, allow_unicode=True, sort_keys=False
        )
    except yaml.YAMLError:  # a value YAML has no tag for (a tuple): JSON, which YAML reads as a list
        return json.dumps(value, default=str)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def set_text(override: Override) -> str:
    """`override` as its `--set` argument (`key=value`, the value written by `yaml_value`)."""
    return f"{override.key}={yaml_value(override.value)}"


def set_args(settings: Settings) -> list[str]:
    """`settings` as command-line arguments: `--set key=value` for each."""
    return [arg for item in as_overrides(settings) for arg in ("--set", set_text(item))]


def command_line(*argv: Any) -> str:
    """A command as a shell reads it back (each argument quoted as it needs, `shlex.quote`): the one writer
    of every command vidforge prints for the user to run."""
    return shlex.join(str(a) for a in argv)
