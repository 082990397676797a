"""The embedding store of a `vidforge caption` output (`vidforge.data.embeddings`): what `vidforge dedup
--keep aesthetic` and `vidforge search --captions` read.

Its rows are the kept clips, in manifest order. Their clip vectors are carried from the clip run's store
(CLIPS_DIR/embeddings/: the clip stage's model, so caption outputs and clip runs deduplicate together),
their durations and the scores the filters keep in the store (`Scorer.store_fields`: the aesthetic
score) are columns, and their captions' CLIP text embeddings
(`curation.caption.clip`'s text tower, the model the index names) are the store's text vectors.

Each clip's text vector is appended to a log under OUT/embeddings/pending/ (`TextLog`: its float32
row, then its id's line) before the clip's ledger commit, so every committed clip's vector is there, and
a killed run leaves at most a row without an id, which is not read. The store itself is rewritten whole
when the run finalizes (as manifest.jsonl is), a shard at a time."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from vidforge import files
from vidforge.curate import filters
from vidforge.curate.captioning.annotator import clip_id_of
from vidforge.data import embeddings as store
from vidforge.errors import UserInputError
from vidforge.profile.caption import Caption

PENDING = "pending"


class TextLog:
    """This process's append-only log of caption text vectors: `<time>-<pid>-d<D>.f32` (rows of D float32)
    and `.ids` (one JSON string a line, the rows' clip ids, each written after its row)."""

    def __init__(self, out_dir: Path):
        self.folder = out_dir / store.EMBEDDINGS_DIR / PENDING
        self.files: tuple[Any, Any] | None = None
        self.dim = 0

    def append(self, clip_id: str, vector: np.ndarray | None) -> None:
        if vector is None:
            return
        vector = np.asarray(vector, np.float32)
        if self.files is None:
            self.dim = len(vector)
            # Named by time: where a redone clip is in two logs, the later name holds its vector.
            stem = self.folder / f"{time.time_ns():020d}-{os.getpid()}-d{self.dim}"
            self.files = (files.open_append(f"{stem}.f32", binary=True), files.open_append(f"{stem}.ids"))
        rows, ids = self.files
        if len(vector) != self.dim:
            raise ValueError(f"{clip_id}: a {len(vector)}-d caption vector in a log of {self.dim}-d ones")
        try:
            rows.write(vector.tobytes())
            rows.flush()
            ids.write(json.dumps(clip_id) + "\n")
            ids.flush()
        except BaseException:
            self.close()  # a row without its id ends this log: the next append starts a new one
            raise

    def close(self) -> None:
        for f in self.files or ():
            f.close()
        self.files = None


def _pending(out_dir: Path) -> tuple[np.ndarray, store.RowSource, int]:
    """(ids, their vectors, width) of every text log, oldest first; a row without its id line (a killed
    run's last) is not read."""
    folder = out_dir / store.EMBEDDINGS_DIR / PENDING
    ids: list[str] = []
    parts, dim = [], 0
    for path in sorted(folder.glob("*.ids")):
        dim = int(path.stem.rsplit("-d", 1)[1])
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.endswith("\n")]
        if lines:
            ids += lines
            parts.append(np.memmap(path.with_suffix(".f32"), np.float32, "r", shape=(len(lines), dim)))
    if len({p.shape[1] for p in parts}) > 1:
        raise UserInputError(
            f"{folder}: caption vectors of several widths (curation.caption.clip changed between runs); "
            "delete the folder and caption into a new OUT"
        )
    return np.asarray(ids, dtype=str), store.RowSource(parts), dim


def _column(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.asarray([np.nan if r.get(key) is None else float(r[key]) for r in rows], np.float32)


def write_caption_store(
    out_dir: Path, clips_dir: Path, manifest: list[dict[str, Any]], cfg: Caption
) -> dict[str, Any]:
    """OUT/embeddings/ for the kept clips of `manifest`, with the `store_fields` of every enabled scorer
    as columns; returns what the summary records of it. Without a store in CLIPS_DIR (a clip run made
    with curation.embed=false) there are no clip vectors to carry, and no store."""
    folder = out_dir / store.EMBEDDINGS_DIR
    kept = [r for r in manifest if r.get("keep")]
    if not (clips_dir / store.EMBEDDINGS_DIR / store.INDEX).is_file():
        (folder / store.INDEX).unlink(missing_ok=True)
        return {"rows": 0, "note": f"{clips_dir} has no embedding store (made with curation.embed=false)"}
    source = store.EmbeddingStore.open(clips_dir)
    at = store.positions(source.ids(), [clip_id_of(r) for r in kept])
    rows = [r for r, a in zip(kept, at, strict=True) if a >= 0]
    ids = [clip_id_of(r) for r in rows]
    pending_ids, pending, text_dim = _pending(out_dir)
    text_at = store.positions(pending_ids, ids)
    columns = {store.DURATION: _column(rows, store.DURATION)}
    columns |= {f: _column(rows, f) for scorer in filters.enabled(cfg) for f in scorer.store_fields}
    text_model = {"name": cfg.clip.model, "checkpoint": cfg.clip.checkpoint}
    store.write_store(
        out_dir,
        ids,
        store.Gathered(source.row_source(), at[at >= 0], source.dim or 0),
        source.model,
        columns,
        text=store.Gathered(pending, text_at, text_dim) if text_dim else None,
        text_model=text_model,
    )
    return {
        "rows": len(ids),
        "text_rows": int(np.sum(text_at >= 0)),
        "not_in_clip_store": len(kept) - len(ids),
        "text_model": text_model if text_dim else None,
    }
