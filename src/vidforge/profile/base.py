"""The base every profile section derives from: frozen, strict about unknown keys, documented."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A part of the run-profile. Frozen so a profile cannot drift while a run uses it; unknown keys are
    errors so a typo in YAML never silently falls back to a default. No number may be inf or nan: no
    setting means either, and `gt=0` bounds let inf through (`--set train.lr=inf` trained on NaNs)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        allow_inf_nan=False,
    )
