"""Shots recorded by a second process (`curation.record_process`, recorder_process.py): the same clips,
byte for byte, as one process records, with the cuts PySceneDetect finds on the same files; `auto` turns
it on only when a core would idle (fewer sources than cores, local executor)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from curation_fixtures import CLIP_OPEN_SETS

from vidforge.curate import clip
from vidforge.curate.executors.local import usable_cores
from vidforge.profile import load_profile

NAMES = ("cuts", "false_split")


def _run(sample_videos: Path, out: Path, *sets: str) -> tuple[list[dict], dict[str, str], dict]:
    run = clip.run(
        load_profile(None, [*CLIP_OPEN_SETS, "curation.min_seconds=0", *sets]),
        [str(sample_videos / f"{n}.mp4") for n in NAMES],
        out,
    )
    records = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "clips").glob("*.mp4")}
    return records, files, run.summary


@pytest.mark.parametrize("workers", ["0", "1"])  # in the driver / in a decode worker process
def test_a_second_recording_process_gives_the_same_clips_and_pyscenedetects_cuts(
    tmp_path, sample_videos, workers
):
    from scenedetect import AdaptiveDetector, detect

    sets = (f"curation.decode_workers={workers}",)
    one, one_files, one_summary = _run(
        sample_videos, tmp_path / "one", "curation.record_process=false", *sets
    )
    two, two_files, two_summary = _run(sample_videos, tmp_path / "two", "curation.record_process=true", *sets)
    assert two == one and two_files == one_files and len(two_files) == len(two)
    assert two_summary["clips_recorded"] == two_summary["clips"] == len(two)  # none cut again
    for name in NAMES:
        theirs = [s.frame_num for s, _ in detect(str(sample_videos / f"{name}.mp4"), AdaptiveDetector())]
        ours = sorted(r["start_frame"] for r in two if Path(r["source"]).stem == name)
        assert ours == theirs


def test_auto_records_in_a_second_process_only_when_a_core_would_idle(tmp_path):
    assert load_profile(None, []).curation.record_process is False  # opt-in until measured idle
    cfg = load_profile(None, ["curation.record_process=auto"]).curation
    cores = usable_cores()
    assert clip.build_stages(cfg, tmp_path, sources=1)[0].record_process == (cores > 1)
    assert clip.build_stages(cfg, tmp_path, sources=cores)[0].record_process is False
    assert clip.build_stages(cfg, tmp_path, sources=1, executor="ray")[0].record_process is False
