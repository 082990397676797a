"""`model`: the diffusion transformer's shape, as its family's own section (`vidforge.families.model`:
`Model`, what every family has, and each family's subclass in its package). A `preset` fills every field
it knows; fields given beside it override the preset (e.g. `{preset: dit-7b, layers: 4}` for a shallow
copy)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, SerializeAsAny
from pydantic_core import core_schema

from vidforge.families import REGISTRY, family, presets
from vidforge.families.model import Model

PRESETS: dict[str, dict[str, Any]] = presets()
"""Every family's named shapes (`vidforge.families`: each family's package lists its own)."""


class _ByFamily:
    """Validates the `model` section as the section class of the family it names (`Model.model_validate`),
    and shows every registered family's section in the JSON schema (`vidforge profile schema`)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_before_validator_function(Model.model_validate, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {
            "description": "The diffusion transformer: the section of the family `family` names (else "
            "the preset's family).",
            "oneOf": [family(name).model.model_json_schema() for name in REGISTRY],
        }


ModelSection = Annotated[Model, SerializeAsAny(), _ByFamily()]
"""The type of `RunProfile.model`: one family's section, dumped with all of its fields."""


def default_model() -> Model:
    """The model of a profile that gives none: the default preset's."""
    return Model.model_validate({})


__all__ = ["PRESETS", "Model", "ModelSection", "default_model"]
