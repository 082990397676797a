"""A stand-in for a `vidforge clip` output made of the sample videos, for caption and review tests."""

from __future__ import annotations

from pathlib import Path

from vidforge.data import testing
from vidforge.data.manifest import read_jsonl, stable_id, write_jsonl

# `vidforge caption` on these clips: sidecar captions, a tiny random CLIP, motion; thresholds that keep
# every moving clip.
SETTINGS = [
    "curation.caption.backend=sidecar",
    "curation.caption.random_weights=true",
    "curation.caption.clip.model=tiny-clip",
    "curation.caption.clip.frames=2",
    "curation.caption.ocr.enabled=false",
    "curation.caption.aesthetic.enabled=true",  # explicit: the default profile may turn them off
    "curation.caption.clip_score.enabled=true",
    "curation.caption.motion.enabled=true",
    "curation.caption.aesthetic.min_score=-1000",
    "curation.caption.clip_score.min_score=-1",
    "curation.caption.batch_clips=2",
]
# `vidforge clip` with one clip per shot, nothing filtered but the shortest, in-process (no workers).
CLIP_OPEN_SETS = [
    "curation.decode_workers=0",
    "curation.transcode_workers=0",
    "curation.stitch=false",
    "curation.embed=false",
    "curation.min_seconds=0.5",
    "curation.static_max_ratio=1",
]
# `vidforge caption` with sidecar captions and no model-backed annotation (a test turns on what it tests).
CAPTION_BARE_SETS = [
    "curation.caption.backend=sidecar",
    "curation.caption.aesthetic.enabled=false",
    "curation.caption.clip_score.enabled=false",
    "curation.caption.ocr.enabled=false",
    "curation.caption.motion.enabled=false",
    "curation.caption.decode_workers=0",
]
NAMES = ["red_square", "motion_static", "motion_slow", "motion_fast", "fade_text"]


def make_clips_dir(root: Path, sample_videos: Path, sample_truth: dict[str, dict]) -> Path:
    """Each sample video in NAMES whole as one clip, plus a corrupt one (it ends as an error:decode)."""
    root = testing.make_clips_dir(
        root, {sample_videos / sample_truth[n]["file"]: sample_truth[n] for n in NAMES}
    )
    records = read_jsonl(root / "manifest.jsonl")
    bad = stable_id("broken", 0, 10)
    (root / "clips" / f"{bad}.mp4").write_bytes(b"not a video at all")
    records.append(
        {
            "clip_id": bad,
            "source": str(sample_videos / "red_square.mp4"),
            "start_s": 0.0,
            "end_s": 1.0,
            "media": f"clips/{bad}.mp4",
        }
    )
    write_jsonl(root / "manifest.jsonl", records)
    return root
