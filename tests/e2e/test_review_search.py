"""The "similar to" box of a curated run's review page (headless Chromium): a clip id ranks the page's
clips by cosine over the run's embedding store, the planted near-copy first after the clip itself, in the
order numpy's cosine gives; clearing shows every clip again."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vidforge.data.embeddings import write_store  # noqa: E402
from vidforge.data.manifest import write_jsonl  # noqa: E402
from vidforge.review.build import run as review  # noqa: E402

ITEMS = "[...document.querySelectorAll('#items .item')].map(r => r.dataset.id)"


def test_similar_box_ranks_the_clips_by_embedding(browser, tmp_path) -> None:
    rng = np.random.default_rng(0)
    n, d = 60, 32
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[17] = x[3] + 0.05 * rng.standard_normal(d)  # a near-copy of clip 3
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = [f"clip{i:03d}" for i in range(n)]
    run = tmp_path / "run"
    write_store(run, ids, x, {"name": "synthetic", "checkpoint": None})
    records = [
        {"clip_id": c, "source": "a.mp4", "start_s": float(i), "end_s": i + 1.0} for i, c in enumerate(ids)
    ]
    write_jsonl(run / "manifest.jsonl", records)
    page = Path(review(run).page)

    browser.open(page.as_uri())
    assert len(browser.js(ITEMS)) == 50  # the first page of all 60
    browser.js("document.querySelector('#similar-id').value = 'clip003'")
    browser.js("document.querySelector('#similar-k').value = '5'")
    browser.click("#similar-go")
    shown = browser.js(ITEMS)
    want = [ids[i] for i in np.argsort(-(x @ x[3]), kind="stable")[:5]]
    assert shown[:2] == ["clip003", "clip017"] and shown == want
    similarity = browser.js(
        "[...document.querySelectorAll('td.score[data-key=similarity]')].map(t => t.dataset.value)"
    )
    assert [float(s) for s in similarity] == sorted((float(s) for s in similarity), reverse=True)
    browser.click("#similar-clear")
    assert len(browser.js(ITEMS)) == 50
