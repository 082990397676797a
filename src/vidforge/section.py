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

from pydantic import BaseModel, ConfigDict, model_validator


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
        defer_build=True,  # validators built at first use: ~0.035 s less CPU before any command starts
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Each field's description is the docstring under it, as pydantic's `use_attribute_docstrings`
        reads them, but with its module's source parsed once: pydantic (inspect.findsource, before Python
        3.13) parses the whole module again for every class, ~0.1 s of every command's start-up."""
        super().__pydantic_init_subclass__(**kwargs)
        docs = _attribute_docstrings(cls.__module__).get(cls.__qualname__, {})
        for name, field in cls.model_fields.items():
            if field.description is None and name in docs:
                field.description = docs[name]

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


@functools.cache
def _attribute_docstrings(module: str) -> dict[str, dict[str, str]]:
    """{class qualname: {attribute: the string literal right under its annotated assignment}} of every
    class in `module`'s source (pydantic's rule); empty where the source cannot be read."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (KeyError, OSError, TypeError, SyntaxError):
        return {}
    found: dict[str, dict[str, str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                found[prefix + node.name] = {
                    first.target.id: inspect.cleandoc(second.value.value)
                    for first, second in zip(node.body, node.body[1:], strict=False)
                    if isinstance(first, ast.AnnAssign)
                    and isinstance(first.target, ast.Name)
                    and isinstance(second, ast.Expr)
                    and isinstance(second.value, ast.Constant)
                    and isinstance(second.value.value, str)
                }
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, f"{prefix}{node.name}.<locals>.")

    visit(tree.body, "")
    return found


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
