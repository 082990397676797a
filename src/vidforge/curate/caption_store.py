"""The embedding store of a `vidforge caption` output (`vidforge.data.embeddings`): what `vidforge dedup
--keep aesthetic` and `vidforge search --captions` read.

Its rows are the kept clips, in manifest order. Their clip vectors are carried from the clip run's store
(CLIPS_DIR/embeddings/: the clip stage's model, so caption outputs and clip runs deduplicate together),
their aesthetic scores and durations are columns, and their captions' CLIP text embeddings
(`curation.caption.clip`'s text tower, the model the index names) are the store's text vectors.

While the run goes, the text vectors are written to OUT/embeddings/pending/ every `PENDING_ROWS`
committed clips; a clip's ledger commit waits for the file holding its vector (`PendingText`), so a
killed run redoes the clips no file holds. The store itself is rewritten whole when the run finalizes
(as manifest.jsonl is), a shard at a time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.curate.annotator import clip_id_of
from vidforge.data import embeddings as store
from vidforge.profile.caption import Caption

PENDING = "pending"
PENDING_ROWS = 512
"""Clips whose ledger commits wait for one pending file: what a killed run redoes at most."""


class PendingText:
    """Committed clips' text vectors, written in batches before their ledger commits (`finish`)."""

    def __init__(self, out_dir: Path, rows: int = PENDING_ROWS):
        self.folder = out_dir / store.EMBEDDINGS_DIR / PENDING
        self.rows = rows
        self.waiting: list[tuple[str, np.ndarray | None, Callable[[], None]]] = []

    def add(self, clip_id: str, vector: np.ndarray | None, finish: Callable[[], None]) -> None:
        """Queue a clip's vector (None: it has none) and its commit; nothing to wait for commits now."""
        if vector is None and not self.waiting:
            finish()
            return
        self.waiting.append((clip_id, vector, finish))
        if len(self.waiting) >= self.rows:
            self.flush()

    def flush(self) -> None:
        with_vectors = [(cid, v) for cid, v, _ in self.waiting if v is not None]
        if with_vectors:
            self.folder.mkdir(parents=True, exist_ok=True)
            # Named by time: where a redone clip is in two files, the later name holds its vector.
            store.write_shard(
                self.folder,
                f"{time.time_ns():020d}-{os.getpid()}",
                [cid for cid, _ in with_vectors],
                np.stack([v for _, v in with_vectors]),
            )
        waiting, self.waiting = self.waiting, []
        for _, _, finish in waiting:
            finish()


def _pending(out_dir: Path) -> tuple[np.ndarray, store.RowSource, int]:
    """(ids, their vectors, width) of every pending file, oldest first."""
    folder = out_dir / store.EMBEDDINGS_DIR / PENDING
    names = sorted(p.name.removesuffix(".ids.npy") for p in folder.glob("*.ids.npy"))
    ids = [np.load(folder / f"{n}.ids.npy") for n in names]
    vectors = [np.load(folder / f"{n}.vectors.npy", mmap_mode="r") for n in names]
    dim = next((v.shape[1] for v in vectors if len(v)), 0)
    return (np.concatenate(ids) if ids else np.zeros(0, str)), store.RowSource(vectors), dim


def _column(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.asarray([np.nan if r.get(key) is None else float(r[key]) for r in rows], np.float32)


def write_caption_store(
    out_dir: Path, clips_dir: Path, manifest: list[dict[str, Any]], cfg: Caption, aesthetic: bool
) -> dict[str, Any]:
    """OUT/embeddings/ for the kept clips of `manifest` (`aesthetic`: the aesthetic filter ran, so the
    column is written); returns what the summary records of it. Without a store in CLIPS_DIR (a clip run
    made with curation.embed=false) there are no clip vectors to carry, and no store."""
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
    columns = {store.DURATION: _column(rows, "duration_s")}
    if aesthetic:
        columns[store.AESTHETIC] = _column(rows, "aesthetic")
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
