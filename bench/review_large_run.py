"""`vidforge review` of a large curation run: build time (thumbnails first, then reused) and how the page
behaves in headless Chromium (open, sort, filter, next page).

    .venv/bin/python bench/review_large_run.py [--clips 10000] [--out /tmp/review_bench]

The run is made of the sample videos (examples/make_sample_videos.py) as clips, each clip a hard link of
one of them under its own name, so every clip gets its own thumbnail. Prints one JSON line a measurement."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "tests")]


def make_run(out: Path, clips: int) -> Path:
    from make_sample_videos import make_sample_videos

    from vidforge.data.manifest import stable_id, write_jsonl

    samples = out / "samples"
    if not (samples / "truth.json").is_file():
        make_sample_videos(samples)
    truth = json.loads((samples / "truth.json").read_text())
    run = out / f"run_{clips}"
    (run / "clips").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(clips):
        name, t = sorted(truth.items())[i % len(truth)]
        media = run / "clips" / f"{i}.mp4"
        if not media.exists():
            os.link(samples / t["file"], media)
        keep = i % 3 != 0
        records.append(
            {
                "clip_id": stable_id("bench", i),
                "source": str(samples / t["file"]),
                "start_s": 0.0,
                "end_s": t["seconds"],
                "caption": name.replace("_", " "),
                "motion": (i * 7919 % 10_000) / 1000,
                "keep": keep,
                "reasons": [] if keep else ["too_static"],
                "media": f"clips/{i}.mp4",
            }
        )
    write_jsonl(run / "manifest.jsonl", records)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=Path("/tmp/review_bench"))
    args = ap.parse_args()
    from vidforge.review.build import run as review

    run = make_run(args.out, args.clips)
    for label in ("first (thumbnails made)", "again (thumbnails reused)"):
        started = time.perf_counter()
        result = review(run)
        print(
            json.dumps(
                {"build": label, "clips": args.clips, "seconds": round(time.perf_counter() - started, 2)}
            )
        )
    print(json.dumps({"index_html_kib": os.path.getsize(result.page) // 1024}))

    from browser import Browser, chromium_or_skip

    browser = Browser(chromium_or_skip())
    try:
        started = time.perf_counter()
        browser.open(Path(result.page).as_uri())
        print(
            json.dumps(
                {"browser": "open and first render", "seconds": round(time.perf_counter() - started, 3)}
            )
        )
        for what in (
            'th[data-sort="motion"]',
            'th[data-sort="motion"]',
            '[data-filter="too_static"]',
            ".next",
        ):
            started = time.perf_counter()
            browser.click(what)
            print(
                json.dumps({"browser": f"click {what}", "seconds": round(time.perf_counter() - started, 3)})
            )
        rows = browser.js("document.querySelectorAll('#items .item').length")
        heap = browser.js("performance.memory ? Math.round(performance.memory.usedJSHeapSize / 1e6) : null")
        print(json.dumps({"rows_in_document": rows, "js_heap_mb": heap}))
    finally:
        browser.close()


if __name__ == "__main__":
    main()
