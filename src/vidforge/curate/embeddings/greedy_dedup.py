"""`--dedup THRESHOLD`: drop clips whose embedding is near an earlier kept clip's (greedy, in manifest
order, so the result does not depend on worker timing)."""

from __future__ import annotations

import numpy as np


def near_duplicates(
    embeddings: np.ndarray, threshold: float, chunk: int = 4096
) -> dict[int, tuple[int, float]]:
    """{dropped row: (kept row it duplicates, cosine)} for unit-vector rows. O(N x kept), in chunks."""
    dropped: dict[int, tuple[int, float]] = {}
    kept: list[int] = []
    for i in range(len(embeddings)):
        best, best_sim = -1, -2.0
        for s in range(0, len(kept), chunk):
            rows = kept[s : s + chunk]
            sims = embeddings[rows] @ embeddings[i]
            j = int(np.argmax(sims))
            if sims[j] > best_sim:
                best, best_sim = rows[j], float(sims[j])
        if best >= 0 and best_sim >= threshold:
            dropped[i] = (best, best_sim)
        else:
            kept.append(i)
    return dropped
