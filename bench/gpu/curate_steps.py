"""The curation rows of the GPU suite: `vidforge clip` (decode, shot split, transcode, embedding) in
clips/s on one device, read against NeMo Curator's nightly minimum for split + embed (12 clips/s on one
8-GPU node: 1.5 per GPU), once with the profile's decode device (`auto`: NVDEC where PyNvVideoCodec is
installed) and once with the CPU decoding, so the row says what the GPU decoder buys. Footage: random
shots from examples/make_sample_videos.py at 720p on the GPU, tiny on the CPU smoke run."""

from __future__ import annotations

import sys
from pathlib import Path

from measure_steps import ROOT, _sets, vidforge
from report import Context, Row

CURATOR_SPLIT_EMBED_PER_GPU = 1.5  # clips/s: NeMo Curator's nightly benchmark, 12 clips/s on 8 GPUs


def _footage(work: Path, smoke: bool) -> list[str]:
    sys.path.insert(0, str(ROOT / "examples"))
    from make_sample_videos import FPS, random_scenes, write_video

    count, (width, height), seconds = (1, (64, 48), 2.0) if smoke else (8, (1280, 720), 6.0)
    videos = work / "videos"
    videos.mkdir(parents=True, exist_ok=True)
    for k in range(count):  # the catalogue's random videos alone (its fixed ones are small and slow to write)
        write_video(
            videos, f"random_{k:03d}", random_scenes(k, seconds, FPS, width, height), FPS, width, height
        )
    return sorted(str(p) for p in videos.glob("random_*.mp4"))


def split_embed(ctx: Context, work: Path) -> list[Row]:
    sources = _footage(work, ctx.smoke)
    base = {
        "curation.embed": True,
        "curation.embed_device": "auto",
        "curation.embed_model": "vidforge-tiny" if ctx.smoke else "ViT-B-32",
        "curation.min_seconds": 0.5,
        "curation.static_max_ratio": 1,
    }
    rows = []
    for decode in ("auto", "cpu"):
        sets = _sets({**base, "curation.decode_device": decode})
        result = vidforge(["clip", *sources, "-o", str(work / f"out-{decode}"), *sets], ctx, timeout=300)
        clips, wall = result["clips"], result["wall_seconds"]
        rows.append(
            Row(
                "split_embed",
                f"vidforge clip, decode_device={decode}: clips/s",
                round(clips / wall, 3) if wall else None,
                "clips/s",
                "NeMo Curator's split + embed minimum per GPU",
                CURATOR_SPLIT_EMBED_PER_GPU,
                f"{clips} clips from {len(sources)} sources in {wall:.1f} s, {base['curation.embed_model']} "
                "(random weights)",
            )
        )
    return rows
