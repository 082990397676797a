"""`vidforge review RUN_DIR`: find what kind of run RUN_DIR is, gather its records, make thumbnails and
plots, and write the page (`vidforge.review.page`)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vidforge.data.manifest import stable_id
from vidforge.data.paths import UnsafePath, inside
from vidforge.errors import UserInputError
from vidforge.review.page import Page, write_page
from vidforge.review.thumbs import IMAGE_SUFFIXES, make_thumbs

# What marks each kind of run directory, checked in this order (a train run dir may hold a manifest of
# its own one day; an infer output never holds metrics).
MARKERS = (("samples.jsonl", "infer"), ("metrics.jsonl", "train"), ("manifest.jsonl", "curation"))


@dataclass
class ReviewResult:
    page: str
    kind: str
    items: int
    thumbs: int
    seconds: float


def run_kind(run_dir: Path) -> str:
    """'curation', 'infer' or 'train', or a UserInputError saying what a run directory holds."""
    if not run_dir.is_dir():
        raise UserInputError(f"RUN_DIR {run_dir}: no such directory")
    for name, kind in MARKERS:
        if (run_dir / name).is_file():
            return kind
    if (run_dir / "checkpoints").is_dir():
        return "train"
    raise UserInputError(
        f"RUN_DIR {run_dir}: not a run to review; point at a `vidforge clip` or `caption` output "
        "(manifest.jsonl), an `infer` output (samples.jsonl) or a `train` run dir (metrics.jsonl)"
    )


def _load(kind: str, run_dir: Path, out: Path) -> Page:
    if kind == "curation":
        from vidforge.review.curation import load

        return load(run_dir, out)
    if kind == "infer":
        from vidforge.review.samples import load_infer

        return load_infer(run_dir)
    from vidforge.review.training import load

    return load(run_dir, out)


def _thumb_name(item_id: str, media: Path) -> str:
    # Named after the media file (stable when the manifest is reordered, so a later review reuses it);
    # the id, made tame (it comes from data), only to help a human find it.
    return (
        f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', item_id)[:60]}_{stable_id(str(media.resolve()), length=10)}.jpg"
    )


def run(
    run_dir: str | Path, out: str | Path | None = None, progress: Callable[[int, int], None] | None = None
) -> ReviewResult:
    """Write the review page of `run_dir` into `out` (default RUN_DIR/review): index.html, thumbs/, plots/.
    `progress(done, total)` is told about the thumbnails, the slow part of a large run."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    kind = run_kind(run_dir)
    out = Path(out) if out is not None else run_dir / "review"
    if out.exists() and not out.is_dir():
        raise UserInputError(f"-o {out}: is a file; give a folder for index.html and its thumbnails")
    out.mkdir(parents=True, exist_ok=True)
    page = _load(kind, run_dir, out)
    path, thumbs = finish(page, run_dir, out, progress)
    return ReviewResult(str(path), kind, len(page.items), thumbs, time.perf_counter() - started)


def finish(
    page: Page, run_dir: Path, out: Path, progress: Callable[[int, int], None] | None = None
) -> tuple[Path, int]:
    """Thumbnails and media links for the page's items (each item's `_media` a name inside its `_run`,
    default `run_dir`), then the page itself. Returns (index.html, thumbnails made)."""
    jobs, outside = [], 0
    for item in page.items:
        name, media = item.pop("_media", None), None
        base = Path(item.pop("_run", run_dir))
        if name is not None:
            # A name from the run's records: one that leads out of the run dir is neither opened nor linked.
            try:
                media = inside(base, name, "media")
            except UnsafePath:
                outside += 1
        item["media"] = os.path.relpath(media, out) if media is not None and media.is_file() else None
        item["thumb"] = None
        if item["media"] is not None:
            thumb = out / "thumbs" / _thumb_name(item["id"], media)
            jobs.append((item, media, thumb))
    if outside:
        page.notes.append(f"{outside} record(s) name media outside {run_dir}: not shown")
    inputs = _input_jobs(page, out)
    made = make_thumbs([(media, thumb) for _, media, thumb in jobs + inputs], progress)
    for (item, _, thumb), ok in zip(jobs + inputs, made, strict=True):
        item["thumb"] = f"thumbs/{thumb.name}" if ok else None
    return write_page(page, out), sum(made)


def _input_jobs(page: Page, out: Path) -> list[tuple[dict, Path, Path]]:
    """Thumbnail jobs for what each item started from (`_inputs`: (label, absolute path) pairs, e.g. the
    image `infer --image` recorded). Only a small JPEG of an image file is made, never a link to it: the
    path is the user's own input, named by the command that wrote the record, not a name inside the run."""
    jobs = []
    for item in page.items:
        item["inputs"] = []
        for label, path in item.pop("_inputs", []):
            source = Path(path)
            entry = {"label": label, "path": path, "thumb": None}
            item["inputs"].append(entry)
            if source.is_absolute() and source.suffix.lower() in IMAGE_SUFFIXES:
                jobs.append((entry, source, out / "thumbs" / _thumb_name(f"input_{item['id']}", source)))
    return jobs
