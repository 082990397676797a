"""The base every profile section derives from: frozen, strict about unknown keys, documented."""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo


class Section(BaseModel):
    """A part of the run-profile. Frozen so a profile cannot drift while a run uses it; unknown keys are
        errors so a typo in YAML never silently falls back to a default. No number may be inf or nan: no
        setting means either, and `gt=0` bounds let inf through (`--set train.lr=inf` trained on NaNs). A yes/no
    is no number: pydantic reads `true` as 1, so `train.steps=true` trained one step without a word."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        validate_default=True,
        allow_inf_nan=False,
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Runs before pydantic collects the fields: each field's description is the string under it
        # (what pydantic's `use_attribute_docstrings` does, at a fraction of its cost: it re-reads and
        # re-tokenizes the source once per class, ~0.09 s of CPU before any command starts).
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__", {})
        for name, doc in _attribute_docs(cls).items():
            annotation = own.get(name)
            if annotation is None or name.startswith("_") or "ClassVar" in str(annotation):
                continue
            value = cls.__dict__.get(name, ...)
            if isinstance(value, FieldInfo):
                if value.description is None:
                    value.description = doc
                    value._attributes_set["description"] = doc
            else:
                setattr(cls, name, Field(value, description=doc))

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


def _attribute_docs(cls: type) -> dict[str, str]:
    """{field: the string literal right under its annotated assignment} in cls's own body."""
    tree = _module_tree(getattr(sys.modules.get(cls.__module__), "__file__", None))
    found = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == cls.__name__]
    if len(found) != 1:  # no source (built in memory) or two classes of one name: no way to tell which
        return {}
    docs = {}
    body = found[0].body
    for statement, following in zip(body, body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


@functools.cache
def _module_tree(path: str | None) -> ast.Module:
    """One parse per module, however many sections it defines."""
    try:
        with open(path, encoding="utf-8") as source:  # type: ignore[arg-type]
            return ast.parse(source.read())
    except (OSError, TypeError, SyntaxError):
        return ast.Module(body=[], type_ignores=[])


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
