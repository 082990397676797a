"""`vidforge search RUN... "text"` and `--like CLIP_ID`: the clips nearest a query in the runs' embedding
stores. A text query goes through the text tower of the model that embedded the clips (open-clip's image
and text towers share one space); an example query is a clip's own vector. With `captions`, the query
is matched against the clips' caption text embeddings instead (a `vidforge caption` output's store),
through the text tower of the caption stage's CLIP model (`curation.caption.clip`). Brute force, shard
by shard over the memory-mapped stores: a million 512-d clips is one pass over 2 GB."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.data.embeddings import TEXT, EmbeddingStore
from vidforge.data.manifest import read_jsonl
from vidforge.data.units import MANIFEST
from vidforge.errors import UserInputError


@dataclass
class Hit:
    rank: int
    clip_id: str
    run: str
    score: float
    record: dict[str, Any] | None = None
    """The clip's manifest record (media path, source, times), where the run has one."""


def _stores(runs: Sequence[str | os.PathLike]) -> list[EmbeddingStore]:
    if not runs:
        raise UserInputError("give at least one RUN (a `vidforge clip` output with embeddings)")
    return [EmbeddingStore.open(r) for r in runs]


def text_query(profile, stores: list[EmbeddingStore], text: str) -> np.ndarray:
    """The text's unit vector from the text tower of the model the stores were embedded by (the profile
    must name that model: another model's space would rank at random)."""
    from vidforge.curate.embeddings.embedder import ImageEmbedder

    cur = profile.curation
    for s in stores:
        if (s.model.get("name"), s.model.get("checkpoint")) != (cur.embed_model, cur.embed_checkpoint):
            raise UserInputError(
                f"{s.run_dir} was embedded by {s.model.get('name')} (checkpoint {s.model.get('checkpoint')}), "
                f"the profile names {cur.embed_model} (checkpoint {cur.embed_checkpoint}); set "
                "curation.embed_model and curation.embed_checkpoint to the run's"
            )
    return ImageEmbedder.from_profile(profile).embed_text([text])[0]


def caption_query(profile, stores: list[EmbeddingStore], text: str) -> np.ndarray:
    """The text's unit vector from the text tower of the caption stage's CLIP model, which must be the
    one that embedded the stores' captions."""
    from vidforge.curate.captioning.annotator import caption_clip_embedder
    from vidforge.device import select_device

    cfg = profile.curation.caption
    for s in stores:
        model = s.text_model or {}
        if s.text_model is not None and (model.get("name"), model.get("checkpoint")) != (
            cfg.clip.model,
            cfg.clip.checkpoint,
        ):
            raise UserInputError(
                f"{s.run_dir}'s captions were embedded by {model.get('name')} (checkpoint "
                f"{model.get('checkpoint')}), the profile names {cfg.clip.model} (checkpoint "
                f"{cfg.clip.checkpoint}); set curation.caption.clip.model and .checkpoint to the run's"
            )
    return caption_clip_embedder(cfg, str(select_device(cfg.device, "curation.caption.device"))).encode_texts(
        [text]
    )[0]


def example_query(stores: list[EmbeddingStore], clip_id: str, what: str = "vectors") -> np.ndarray:
    for s in stores:
        for ids, vectors in s.shards(what):
            hit = np.flatnonzero(ids == clip_id)
            if len(hit):
                vector = np.asarray(vectors[hit[0]], np.float32)
                if not np.isfinite(vector).all():
                    raise UserInputError(
                        f"--like {clip_id}: its stored vector is not finite (NaN or inf) in "
                        f"{s.folder}; rerun `vidforge clip` on its source"
                    )
                if not vector.any():  # a zero text row: the clip has no caption
                    raise UserInputError(
                        f"--like {clip_id}: the clip has no caption to match; drop --captions"
                    )
                return vector
    raise UserInputError(f"--like {clip_id}: no such clip id in the runs' embeddings")


def top_k(
    stores: list[EmbeddingStore],
    query: np.ndarray,
    k: int,
    exclude: str | None = None,
    what: str = "vectors",
) -> list[tuple[float, int, str]]:
    """(cosine, run index, clip id) of the k best rows of the `what` vectors (the clips', or "text": their
    captions'), best first; ties to the earlier run and row. A zero row (no caption) is never a hit."""
    query = np.asarray(query, np.float32)
    query = query / max(float(np.linalg.norm(query)), 1e-12)
    best: list[tuple[float, int, int, str]] = []  # (-score, run, row, id): sorts best first
    for r, store in enumerate(stores):
        row0 = 0
        for ids, vectors in store.shards(what):
            vectors = np.asarray(vectors, np.float32)
            if vectors.shape[1] != len(query):
                raise UserInputError(
                    f"{store.run_dir}: {vectors.shape[1]}-d embeddings, the query is {len(query)}-d"
                )
            norms = np.linalg.norm(vectors, axis=1)
            scores = np.where(norms > 0, vectors @ query / np.maximum(norms, 1e-12), -np.inf)
            if exclude is not None:
                scores[ids == exclude] = -np.inf
            take = np.argsort(-scores, kind="stable")[:k]
            best += [
                (-float(scores[i]), r, row0 + int(i), str(ids[i])) for i in take if np.isfinite(scores[i])
            ]
            best = sorted(best)[:k]
            row0 += len(ids)
    return [(-s, r, cid) for s, r, _, cid in best]


def _records(run: Path, wanted: set[str]) -> dict[str, dict[str, Any]]:
    path = run / MANIFEST
    if not path.is_file() or not wanted:
        return {}
    return {r["clip_id"]: r for r in read_jsonl(path) if r.get("clip_id") in wanted}


def search(
    profile,
    runs: Sequence[str | os.PathLike],
    text: str | None = None,
    like: str | None = None,
    k: int = 10,
    captions: bool = False,
) -> list[Hit]:
    """The top `k` clips of `runs` for a text or an example clip (exactly one of them), by the clips'
    embeddings or, with `captions`, by their captions' text embeddings."""
    if (text is None) == (like is None):
        raise UserInputError("give either a TEXT query or --like CLIP_ID, not both")
    stores = _stores(runs)
    what = TEXT if captions else "vectors"
    if text is not None:
        query = (caption_query if captions else text_query)(profile, stores, text)
    else:
        query = example_query(stores, like, what)
    found = top_k(stores, query, k, exclude=like, what=what)
    records: dict[int, dict[str, dict]] = {}
    for r in {r for _, r, _ in found}:
        records[r] = _records(stores[r].run_dir, {cid for _, rr, cid in found if rr == r})
    return [
        Hit(i + 1, cid, str(stores[r].run_dir), score, records[r].get(cid))
        for i, (score, r, cid) in enumerate(found)
    ]
