"""The base every profile section derives from: frozen, strict about unknown keys, documented."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Section(BaseModel):
    """A part of the run-profile. Frozen so a profile cannot drift while a run uses it; unknown keys are
        errors so a typo in YAML never silently falls back to a default. No number may be inf or nan: no
        setting means either, and `gt=0` bounds let inf through (`--set train.lr=inf` trained on NaNs). A yes/no
    is no number: pydantic reads `true` as 1, so `train.steps=true` trained one step without a word."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        allow_inf_nan=False,
        defer_build=True,  # validators built at first use: ~0.035 s less CPU before any command starts
    )

    @model_validator(mode="before")
    @classmethod
    def _no_yes_no_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if (
                    isinstance(value, bool)
                    and field is not None
                    and _takes_numbers_not_bools(field.annotation)
                ):
                    raise ValueError(f"{name}: {str(value).lower()} is a yes/no, and {name} takes a number")
        return data


def _takes_numbers_not_bools(annotation: Any) -> bool:
    options = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    # Plain numbers only (`int`, `float | None`): a field that also takes words has its own validator.
    return bool(set(options) & {int, float}) and set(options) <= {int, float, type(None)}


def unknown_field(name: str, valid: Sequence[str]) -> str:
    """The message for a misspelt field or section: the nearest valid name, else every valid one."""
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.75)  # a typo, not a cousin
    if close:
        return f"unknown field; did you mean {close[0]}?"
    return "unknown field" + (f"; valid fields here: {', '.join(valid)}" if valid else "")
