"""The review of a curation run: a `vidforge caption` output (every clip with its caption, scores, keep and
reasons) or a `vidforge clip` output (kept clips in manifest.jsonl, rejected shots in rejected.jsonl)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vidforge.curate.histograms import CLIP_TITLES, draw_histograms, titles
from vidforge.data.manifest import read_jsonl
from vidforge.profile.caption import Caption
from vidforge.review.page import Page

# Numeric record fields that describe where a clip is, not how good it is: not offered as score columns.
PLACEMENT = {
    "start_frame",
    "end_frame",
    "start_s",
    "end_s",
    "fps",
    "width",
    "height",
    "frames",
    "shots",
    "source_fps",
    "source_width",
    "source_height",
    "embedding_row",
}


def number(value: Any) -> float | int | None:
    """A finite number, or None (JSON has no NaN, and a NaN score is a score nobody measured)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _media(record: dict[str, Any]) -> str | None:
    for key in ("media", "path"):  # caption outputs name it `media`, clip outputs `path`
        if record.get(key):
            return str(record[key])
    return None


def _item(record: dict[str, Any], keep: bool, reasons: list[str]) -> dict[str, Any]:
    scores = {}
    for key, value in record.items():
        v = number(value)
        if v is not None and key not in PLACEMENT and not key.startswith("_"):
            scores[key] = v
    return {
        "id": str(record.get("clip_id") or record.get("id") or ""),
        "source": str(record.get("source") or ""),
        "start_s": number(record.get("start_s")),
        "end_s": number(record.get("end_s")),
        "caption": record.get("caption") or "",
        "scores": scores,
        "keep": keep,
        "reasons": reasons,
        "_media": _media(record),
    }


def load(run_dir: Path, out: Path) -> Page:
    """The page of the curation run in `run_dir`; its histograms are drawn into `out`/plots."""
    records = read_jsonl(run_dir / "manifest.jsonl")
    if any("keep" in r for r in records):  # a caption output: every clip, decided
        stage = "caption"
        items = [_item(r, bool(r.get("keep")), list(r.get("reasons") or [])) for r in records]
    else:  # a clip output: kept clips here, shots the clip stage dropped in rejected.jsonl (no media)
        stage = "clip"
        items = [_item(r, True, []) for r in records]
        rejected = run_dir / "rejected.jsonl"
        for r in read_jsonl(rejected) if rejected.is_file() else []:
            # The stage is the reason to filter by; its message (with the measured value) is the detail.
            item = _item(r, False, [str(r.get("stage") or "rejected")])
            item["detail"] = str(r.get("reason") or "")
            items.append(item)
    scores = sorted({k for item in items for k in item["scores"]})
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    kept = sum(item["keep"] for item in items)
    sources = {item["source"] for item in items}
    page = Page(
        kind="curation",
        title=f"vidforge {stage}: {run_dir.name}",
        summary=[
            ("run", str(run_dir)),
            ("clips", str(len(items))),
            ("kept", str(kept)),
            ("rejected", str(len(items) - kept)),
            ("sources", str(len(sources))),
        ],
        items=items,
        scores=scores,
    )
    errors = run_dir / "errors.jsonl"
    if errors.is_file() and errors.stat().st_size:
        page.summary.append(("errors", f"{len(read_jsonl(errors))} (errors.jsonl)"))
    # The thresholds the run decided by and its panels' titles, as its summary.json records them.
    limits = summary.get("thresholds") or {}
    if not limits:
        page.notes.append("summary.json records no thresholds (a run from before they were recorded)")
    page.search, note = similar_index(run_dir, [item["id"] for item in items])
    if note:
        page.notes.append(note)
    plot = out / "plots" / "histograms.png"
    names = summary.get("titles") or (_caption_titles(summary) if stage == "caption" else CLIP_TITLES)
    if draw_histograms([{**i["scores"], "keep": i["keep"]} for i in items], limits, names, plot):
        page.plots.append({"src": "plots/histograms.png", "title": "score histograms"})
    return page


def _caption_titles(summary: dict[str, Any]) -> dict[str, str]:
    """Panel titles of a caption run whose summary.json records none (a run from before it did): the
    filters' titles under the default profile, at the motion size it recorded."""
    size = summary.get("motion_size")
    return titles(Caption.model_validate({"motion": {"size": size}} if size else {}))


MAX_VALUES = 8_000_000
"""Largest clips x dimensions the page carries for its "similar to" box (8 MB of int8, 11 MB as base64)."""


def similar_index(run_dir: Path, item_ids: list[str]) -> tuple[dict | None, str | None]:
    """The "similar to" box's data for the clips of `run_dir`'s embedding store that the page lists:
    their ids and their vectors quantised to int8 (a unit vector's components are within +-1; cosine
    ranking survives the rounding), base64. Returns (data or None, a note on why there is none)."""
    import base64

    import numpy as np

    from vidforge.data.embeddings import EMBEDDINGS_DIR, INDEX, EmbeddingStore

    if not (run_dir / EMBEDDINGS_DIR / INDEX).is_file():
        return None, None
    store = EmbeddingStore.open(run_dir)
    if store.rows * (store.dim or 0) > MAX_VALUES:
        return None, f"{store.rows} clips: too many for the page's similarity box; use `vidforge search`"
    ids, vectors = store.ids(), store.vectors()
    shown = np.isin(ids, np.asarray(item_ids, dtype=ids.dtype)) if len(ids) else np.zeros(0, bool)
    quantised = np.clip(np.rint(vectors[shown] * 127), -127, 127).astype(np.int8)
    data = {
        "ids": ids[shown].tolist(),
        "dim": store.dim,
        "int8": base64.b64encode(quantised.tobytes()).decode(),
    }
    return data, None
