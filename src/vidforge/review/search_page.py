"""The review page of a `vidforge search`: the hits in rank order, each with its similarity."""

from __future__ import annotations

from pathlib import Path

from vidforge.review.build import finish
from vidforge.review.curation import _item
from vidforge.review.page import Page


def write_search_page(hits, query: str, out: str | Path) -> Path:
    """index.html (with thumbnails) under `out` for `hits` (vidforge.curate.embeddings.search.Hit, best first)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = []
    for hit in hits:
        item = _item(hit.record or {"clip_id": hit.clip_id}, True, [])
        item["scores"] = {"rank": hit.rank, "similarity": round(hit.score, 6), **item["scores"]}
        item["_run"] = hit.run
        items.append(item)
    page = Page(
        kind="curation",
        title=f"vidforge search: {query}",
        summary=[
            ("query", query),
            ("hits", str(len(hits))),
            ("runs", ", ".join(sorted({h.run for h in hits}))),
        ],
        items=items,
        scores=["rank", "similarity"],
    )
    path, _ = finish(page, Path(out), out)
    return path
