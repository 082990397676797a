"""The scorer protocol: what one curation filter of `vidforge caption` is (NeMo Curator's stage shape:
a one-time `setup` that fails fast, then batched work).

A scorer owns, in one module: its profile section (`section`, an attribute of `curation.caption`, and
`Settings`, that section's class), the record fields it writes (`fields`), a check of what the user gave
that runs before anything loads (`check`: files only, no torch), the frames it reads (`frames`), its
model (`setup`, once), a batched `score`, its reject rule (`reject`, with the `reasons` it gives) and
its histogram panels (`histograms`: title and thresholds by record key). The annotator, the decision,
the decode stage, the summary and the review page iterate over the enabled scorers of the registry
(`vidforge.curate.filters.REGISTRY`); adding a filter is one module and one registry line.

Imports no torch, open-clip or EasyOCR: the decode workers and the pre-flight checks import this."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from vidforge.curate.captioning.captioners import ClipItem
from vidforge.errors import UserInputError
from vidforge.profile.caption import Caption
from vidforge.section import Section

RANDOM_HINT = "or set curation.caption.random_weights=true (tests and demos only)"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


@dataclass
class Clip:
    """One clip as a scorer sees it."""

    item: ClipItem
    """Its record and decoded frames (those every enabled scorer's `frames` asked for)."""
    row: dict[str, Any]
    """Its annotations so far: the caption and the fields of the scorers before this one."""
    embeddings: np.ndarray | None = None
    """Unit-length CLIP image embeddings of `curation.caption.clip.frames` frames, for scorers with
    `uses_clip` (None for the others, or when embedding this clip failed)."""
    text_embedding: np.ndarray | None = None
    """The caption's unit-length CLIP text embedding (same model), for scorers with `uses_clip` (None
    without a caption)."""


@dataclass
class Resources:
    """What `setup` gets: where models run, whether missing weights may be random, and the shared CLIP
    embedder (`curate.scorers.clip_score.ClipEmbedder`, set up; None when no enabled scorer `uses_clip`)."""

    device: str
    random_weights: bool
    embedder: Any = None


@dataclass(frozen=True)
class Histogram:
    """One panel of the score histograms: its title and the thresholds drawn on it."""

    title: str
    thresholds: tuple[float, ...]


class Scorer:
    """Base class of a curation filter. Subclasses set the class attributes and override `score_clip`
    (or `score`, to batch across clips), `reject` and `histograms`, and `check`/`setup` when they load
    something."""

    name: ClassVar[str]
    """The step: timings are keyed by it, and a clip it fails on is rejected for `error:<name>`."""
    section: ClassVar[str | None] = None
    """Attribute of `curation.caption` holding its settings (None: `name`). A scorer whose section is not
    in the profile runs with `Settings()`'s defaults."""
    Settings: ClassVar[type[Section]]
    """Its section's class; must have `enabled`."""
    fields: ClassVar[tuple[str, ...]] = ()
    """Record fields it writes (every record has them, None when not measured)."""
    store_fields: ClassVar[tuple[str, ...]] = ()
    """Of `fields`, those the caption output's embedding store holds as columns (`data.embeddings.COLUMNS`
    names them; `vidforge dedup`'s keep rules read them)."""
    reasons: ClassVar[tuple[str, ...]] = ()
    """Reject reasons it can give, in the order the summary lists them."""
    uses_clip: ClassVar[bool] = False
    """Reads the shared CLIP image embeddings (`Clip.embeddings`)."""
    reads_text: ClassVar[bool] = False
    """Reads the caption's CLIP text embedding (`Clip.text_embedding`): a clip whose caption fails to
    embed is its error."""

    def __init__(self, settings: Any):
        self.settings = settings
        self.random_weights = False
        """True once `setup` built its model without weights (recorded in every record)."""

    @classmethod
    def settings_of(cls, cfg: Caption) -> Any:
        section = getattr(cfg, cls.section or cls.name, None)
        return section if section is not None else cls.Settings()

    @property
    def enabled(self) -> bool:
        return bool(self.settings.enabled)

    def check(self, cfg: Caption) -> None:
        """Refuse (UserInputError naming the setting) what the user gave wrong, reading files only; `cfg`
        is `curation.caption`. What only loading can tell is `setup`'s."""

    def frames(self, count: int) -> set[int]:
        """Indices of the frames it reads of a clip of `count` frames (every scorer's are decoded once)."""
        return set()

    def setup(self, resources: Resources) -> None:
        """Load the model once; raise UserInputError for what the user must fix."""

    def score(self, clips: list[Clip]) -> list[dict[str, Any] | Exception]:
        """Per clip: the fields it measured, or the exception it failed with (that clip's error; the
        others go on)."""
        out: list[dict[str, Any] | Exception] = []
        for clip in clips:
            try:
                out.append(self.score_clip(clip))
            except Exception as err:  # noqa: BLE001 - this clip's error
                out.append(err)
        return out

    def score_clip(self, clip: Clip) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} overrides neither score() nor score_clip()")

    def reject(self, record: dict[str, Any]) -> list[str]:
        """The reasons (of `reasons`) to reject an annotated record; empty: this scorer keeps it."""
        return []

    def histograms(self) -> dict[str, Histogram]:
        """Histogram panels by record key."""
        return {}


def finite(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def below(value: Any, threshold: float) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value < threshold


# -- checks of what the user gave ---------------------------------------------------------------------
def check_weights_file(path: str | None, random_weights: bool, field: str) -> None:
    """A model's local weights file is named and there (random weights stand in only where allowed)."""
    if path is None and not random_weights:
        raise UserInputError(
            f"{field}: give the local weights file (nothing is downloaded), or turn this step off"
        )
    if path is not None and not Path(path).is_file():
        raise UserInputError(f"{field}: no such file {path}")


def open_clip_config(model: str, checkpoint: str | None, random_weights: bool, field: str) -> dict | None:
    """Check the files an open-clip model is loaded from (`curate.scorers.clip_score.load_open_clip`) and return
    its config when the user gave it (a `local-dir:` folder's `open_clip_config.json`); None for a
    built-in name, whose config and existence only open-clip knows (the model's setup checks them)."""
    if model.startswith("local-dir:"):
        folder = Path(model.removeprefix("local-dir:"))
        config_file = folder / "open_clip_config.json"
        if not config_file.is_file():
            raise UserInputError(
                f"{field}.model: {folder} has no open_clip_config.json; give an open-clip model folder"
            )
        if not random_weights and not any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir()):
            raise UserInputError(f"{field}.model: {folder} has no weights file; add one, {RANDOM_HINT}")
        try:
            data = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise UserInputError(f"{field}.model: {config_file} is not JSON ({err})") from None
        return data.get("model_cfg", data) if isinstance(data, dict) else None
    if checkpoint:
        if not Path(checkpoint).is_file():
            raise UserInputError(f"{field}.checkpoint: no such file {checkpoint}")
    elif not random_weights:
        raise UserInputError(
            f"{field}.checkpoint: no weights for {model}; give a local open-clip checkpoint or a local-dir: model "
            f"(nothing is downloaded), {RANDOM_HINT}"
        )
    return None


def tensor_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """{key: shape} of the state dict in a weights file, from its header: a `.safetensors` file's JSON
    header, else `torch.load(weights_only=True, mmap=True)` (torch's safe loader: no code runs, and the
    tensor data is mapped, not read). A file that does not read raises what its reader raised."""
    if file.suffix == ".safetensors":
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    import torch

    state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        return {}
    return {str(k): tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
