"""Finding, reading and overriding run-profiles, with one-line errors that name the field and the fix."""

from __future__ import annotations

import copy
import os
import re
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vidforge.profile.checks import profile_problems
from vidforge.profile.overrides import Override, ProfileError, Settings, as_overrides, parse_set
from vidforge.profile.run_profile import RunProfile
from vidforge.section import unknown_field

PROFILE_ENV = "VIDFORGE_PROFILE"
# Shipped profiles live in the package (the repository's profiles/ links there), so a bare name and the
# default resolve from any working directory; a ./profiles of the user's own is searched first.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "profiles"
PROFILE_DIRS = (Path("profiles"), SHIPPED_DIR)
DEFAULT_NAME = "local_cpu"


def shipped_profiles() -> list[Path]:
    """Profiles by name: ./profiles first, then those shipped with vidforge."""
    found: dict[str, Path] = {}
    for directory in PROFILE_DIRS:
        for path in sorted(directory.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return [found[name] for name in sorted(found)]


def resolve_profile_path(profile: str | os.PathLike | None) -> Path:
    """The file to read: the argument, else $VIDFORGE_PROFILE, else `local_cpu`. A bare name
    (`dit1b_1xh200`) means profiles/<name>.yaml, in ./profiles or among the shipped ones."""
    chosen = profile if profile is not None else os.environ.get(PROFILE_ENV) or DEFAULT_NAME
    path = Path(chosen)
    if path.is_file():
        return path
    if path.suffix == "" and len(path.parts) == 1:
        for candidate in shipped_profiles():
            if candidate.stem == path.name:
                return candidate
    names = ", ".join(p.stem for p in shipped_profiles())
    raise ProfileError(f"profile not found: {chosen}; pass --profile PATH or a shipped name ({names})")


def load_profile(profile: str | os.PathLike | None = None, overrides: Settings = ()) -> RunProfile:
    """Read a profile, apply `overrides` (typed, or `--set` texts: `overrides.Settings`), validate. Raises
    ProfileError."""
    path = resolve_profile_path(profile)
    where = str(path)
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ProfileError(f"{where}: not valid YAML{at}: {getattr(err, 'problem', err)}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ProfileError(
            f"{where}: the top level must be a mapping of sections, got {type(loaded).__name__}"
        )
    data: dict[str, Any] = loaded or {}
    data.setdefault("name", path.stem)
    items = as_overrides(overrides)
    apply_overrides(data, items)
    return validate_profile(data, where, items)


def validate_profile(
    data: dict[str, Any], where: str = "profile", overrides: Sequence[Override] = ()
) -> RunProfile:
    """The validated profile; ProfileError naming, for each problem, where it came from: the `--set`
    that gave the field its value, else the file (`where`)."""
    try:
        profile = RunProfile.model_validate(data)
    except ValidationError as err:
        # One error may hold several `field: message` problems joined by "; ".
        problems = [p for e in err.errors(include_url=False) for p in _PROBLEMS.split(_format_one(e))]
        raise ProfileError(_attribute(problems, where, overrides)) from None
    problems = profile_problems(profile)  # the one rulebook of what the trainer can run, and each stage's
    if problems:
        raise ProfileError(_attribute(problems, where, overrides))
    return profile


def _attribute(problems: list[str], where: str, overrides: Sequence[Override]) -> str:
    """`--set k=v: field: message` for problems in an overridden field, `where: ...` for the rest."""
    items = {item.key: item for item in overrides}  # a later --set of a key wins
    from_set, from_file = [], []
    for problem in problems:
        field, _, message = problem.partition(": ")
        # the --set nearest the field: `train.lora.rnak=8` over a `train.lora={...}` given before it, and
        # `train.lra.rank=8` for the unknown section `train.lra` it made
        unknown = message.startswith("unknown field")
        keys = [
            k
            for k in items
            if field == k or field.startswith(k + ".") or (unknown and k.startswith(field + "."))
        ]
        key = max(keys, key=len, default=None)
        if key is None:
            from_file.append(problem)
        else:
            from_set.append(f"--set {items[key]}: {message if field == key else problem}")
    file_part = [f"{where}: {'; '.join(from_file)}"] if from_file else []
    return "; ".join(from_set + file_part)


def apply_overrides(data: dict[str, Any], overrides: Settings) -> None:
    """Apply `overrides` (`overrides.Settings`) in order to the raw data; the schema then checks them."""
    for item in as_overrides(overrides):
        apply_override(data, item)


def apply_override(data: dict[str, Any], item: Override | str) -> None:
    """Set `item`'s field (nested to any depth) in the raw data; a str is a `--set` as typed."""
    override = item if isinstance(item, Override) else parse_set(item)
    *parents, leaf = override.key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if isinstance(child, str):  # a shorthand such as `accelerator: h100` becomes a mapping to override
            child = {"name": child} if part != "accelerator" else _expand_accelerator(child)
        if not isinstance(child, dict):
            child = {}
        node[part] = child
        node = child
    node[leaf] = copy.deepcopy(override.value)  # the data is edited in place by later overrides


def _expand_accelerator(name: str) -> dict[str, Any]:
    from vidforge.profile.cluster import KNOWN_ACCELERATORS

    return {"name": name, **KNOWN_ACCELERATORS.get(name, {})}


_PROBLEMS = re.compile(r"; (?=[a-z_][a-z0-9_.]*: )")
_SUBPATH = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*): (.*)$", re.S)


def _format_one(error: dict[str, Any]) -> str:
    path = ".".join(str(p) for p in error["loc"])
    msg = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error["type"] == "extra_forbidden":
        msg = unknown_field(str(error["loc"][-1]), _valid_fields(error["loc"][:-1]))
    elif error["type"] != "value_error":
        given = error.get("input")
        if not isinstance(given, dict | list):
            msg = f"{msg}, got {given!r}"
    sub = _SUBPATH.match(msg)
    if sub and error["type"] == "value_error":
        path = f"{path}.{sub.group(1)}" if path else sub.group(1)
        msg = sub.group(2)
    return f"{path}: {msg}" if path else msg


def _valid_fields(loc: Iterable[Any]) -> list[str]:
    model: Any = RunProfile
    for part in loc:
        field = _section(model).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(_section(model))


def _section(annotation: Any) -> dict[str, Any]:
    """The fields of a section type, through `Section | None` (an optional section such as train.lora)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        fields = getattr(candidate, "model_fields", None)
        if fields:
            return fields
    return {}


def dump_profile(profile: RunProfile) -> str:
    """The resolved profile as YAML (what `vidforge profile show` prints)."""
    return yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False)
