"""The review page: one `index.html` with its data, script and style inlined, beside `thumbs/` and
`plots/`. It opens from disk (file://) with no server: the data is a JSON block in the page rather than
a file fetched at load time (browsers refuse fetch() between file:// URLs), and media are relative links."""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from vidforge.data.manifest import atomic_path

INDEX = "index.html"


@dataclass
class Page:
    """What a review page shows. `items` are clips or samples: dicts with `id`, `thumb` and `media` (paths
    relative to the page, which `build.run` fills in from the loaders' `_media`, a name in the run dir), `caption`, `scores` (name -> number, the sortable columns named in `scores`),
    `meta` (name -> value, shown as is), and for clips `source`, `start_s`, `end_s`, `keep`, `reasons` (and `detail`, a
    rejection's message);
    `group` (e.g. the validation step) where items come in groups. `plots`: {src, title} images."""

    kind: str  # "curation" | "infer" | "train"
    title: str
    summary: list[tuple[str, str]] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)
    scores: list[str] = field(default_factory=list)
    plots: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    search: dict[str, Any] | None = None
    """A curated run's embeddings for the "similar to" box (`curation.similar_index`), or None."""


def _asset(name: str) -> str:
    return resources.files("vidforge.review").joinpath("assets", name).read_text(encoding="utf-8")


def script_json(value: Any) -> str:
    """`value` as JSON that the HTML parser passes through a <script> block untouched, whatever it holds.
    Escaping "</" alone was not enough: "<!--<script>" in a caption moves the parser into the script's
    double-escaped state, where "</script>" no longer ends the block, and the page's own script was read
    as data (a blank page, 0 rows). With no "<", ">" or "&" left (each a JSON \\u escape inside a
    string, the only place JSON can hold one), the parser never leaves the plain script-data state."""
    text = json.dumps(_finite(value), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as null: records may hold them (Python's JSON reads NaN), JSON.parse
    refuses them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_page(page: Page, out: Path) -> Path:
    data = script_json(asdict(page))
    values = {
        "title": html.escape(page.title),
        "style": _asset("review.css"),
        "data": data,
        "script": _asset("review.js") + "\n" + _asset("search.js"),
    }
    # One pass, so that a "{{...}}" inside the data (a caption) is never substituted itself.
    text = re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], _asset("review.html"))
    target = out / INDEX
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return target
