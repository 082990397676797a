"""The static filter on real footage: for every clip of `vidforge clip` runs (made with
`--set curation.static_max_ratio=1`, so every clip is kept and listed), the per-frame greyscale mean
absolute difference to the previous frame, measured as the clip stage measures it (decoded, resized to
PySceneDetect's detection size), and the share of frames under each candidate
`curation.static_threshold`: the clip's static ratio at that threshold.

    python bench/static_calibration.py RUN_DIR [RUN_DIR ...] [--thresholds 0.9 0.5 0.3 0.1]

docs/benchmarks.md ("static filter") has the table it printed for PySceneDetect's test videos and the
sample catalogue."""

from __future__ import annotations

import argparse
from pathlib import Path

import av
import cv2
import numpy as np

from vidforge.curate.clipping.shots import detection_size, downscale
from vidforge.data.manifest import read_jsonl


def frame_differences(path: str) -> np.ndarray:
    """Greyscale mean absolute difference of each frame to the one before it (frame 0: none)."""
    grays = []
    with av.open(path) as container:
        stream = container.streams.video[0]
        size = None
        for frame in container.decode(stream):
            bgr = frame.to_ndarray(format="bgr24")
            size = size or detection_size(frame.width, frame.height)
            grays.append(cv2.cvtColor(downscale(bgr, size), cv2.COLOR_BGR2GRAY).astype(np.int16))
    return np.abs(np.diff(np.stack(grays), axis=0)).mean(axis=(1, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--thresholds", nargs="+", type=float, default=[0.9, 0.5, 0.3, 0.1])
    args = parser.parse_args()
    print(
        "| source | frames | median diff | 10th pct | "
        + " | ".join(f"ratio @{t:g}" for t in args.thresholds)
        + " |"
    )
    print("|---" * (4 + len(args.thresholds)) + "|")
    cache: dict[str, np.ndarray] = {}
    for run in args.runs:
        for record in read_jsonl(run / "manifest.jsonl"):
            source = record["source"]
            if source not in cache:
                cache[source] = frame_differences(source)
            # as static_ratio(): the clip's first frame (compared with the frame before it) left out
            diffs = cache[source][record["start_frame"] : record["end_frame"] - 1]
            ratios = " | ".join(f"{(diffs < t).mean():.2f}" for t in args.thresholds)
            print(
                f"| {Path(source).name} | {record['start_frame']}-{record['end_frame']} | "
                f"{np.median(diffs):.3f} | {np.percentile(diffs, 10):.3f} | {ratios} |"
            )


if __name__ == "__main__":
    main()
