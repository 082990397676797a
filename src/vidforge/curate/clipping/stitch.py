"""Stage 3: event stitching (Vchitect-2.0, after Panda-70M). Embed the last N frames of a shot and the
first N of the next; when the cosine similarity of their mean embeddings reaches the threshold, the cut
was a false one (a flash, a camera jump inside one event) and the shots merge."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vidforge.curate.items import Shot

PooledEmbed = Callable[[np.ndarray], np.ndarray]
"""(N, H, W, 3) uint8 frames -> one (D,) unit vector (ImageEmbedder.pooled)."""


def boundary_similarity(
    left: Shot, right: Shot, boundary: dict[int, np.ndarray], n: int, pooled: PooledEmbed
) -> float:
    """Cosine similarity between the last n frames of `left` and the first n of `right` (each clamped to
    its own shot)."""
    cut = right.start
    before = [boundary[i] for i in range(max(left.start, cut - n), cut) if i in boundary]
    after = [boundary[i] for i in range(cut, min(right.end, cut + n)) if i in boundary]
    if not before or not after:
        raise ValueError(f"no boundary frames around the cut at frame {cut}")
    return float(pooled(np.stack(before)) @ pooled(np.stack(after)))


def stitch_shots(
    shots: list[Shot], boundary: dict[int, np.ndarray], n: int, threshold: float, pooled: PooledEmbed
) -> tuple[list[Shot], list[float]]:
    """Merge adjacent shots whose boundary similarity is >= threshold. Returns the merged shots and the
    similarity at every original cut (for the record)."""
    if not shots:
        return [], []
    merged = [Shot(shots[0].start, shots[0].end, shots[0].score, shots[0].merged)]
    sims = []
    for prev, shot in zip(shots[:-1], shots[1:], strict=False):
        sim = boundary_similarity(prev, shot, boundary, n, pooled)
        sims.append(sim)
        if sim >= threshold:
            last = merged[-1]
            merged[-1] = Shot(last.start, shot.end, last.score, last.merged + shot.merged)
        else:
            merged.append(Shot(shot.start, shot.end, shot.score, shot.merged))
    return merged, sims
