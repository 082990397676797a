"""`kill -9` mid-run, then the same command again, for `caption`, `shard` and `tokenize` (as the clip and
train tests do for theirs): the finished output equals an uninterrupted run's, byte for byte. The killed
run is a real `vidforge` process (its own session, killed whole with SIGKILL once it has committed a
unit and before it has committed them all); the reference and the resume run in this process.

`tokenize` runs in every `make test` (2-4 s). `shard` and `caption` load a text tower or CLIP in each of
their three runs: 7 s and 9 s on a quiet 2-core machine, 20 s and 15 s while other jobs load it, which
with the rest of the suite's budget makes them opt-in: VIDFORGE_TEST_KILL_RESUME=1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vidforge.curate import caption
from vidforge.data.sharding import run as shard_run
from vidforge.data.testing import SMALL_SHARD_SETS, make_annotated_dir, make_clips_dir
from vidforge.profile import load_profile
from vidforge.tokenizers.tokenize import run as tokenize_run

OPT_IN = pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_KILL_RESUME") != "1",
    reason="15-35 s: set VIDFORGE_TEST_KILL_RESUME=1 to kill and resume shard and caption too",
)
SRC = str(Path(__file__).resolve().parents[2] / "src")
DATA_SETS = [*SMALL_SHARD_SETS, "tokenizer.prefetch=1"]
CAPTION_SETS = [
    "curation.caption.backend=sidecar",
    "curation.caption.random_weights=true",
    "curation.caption.clip.model=tiny-clip",
    "curation.caption.clip.frames=2",
    "curation.caption.ocr.enabled=false",
    "curation.caption.aesthetic.enabled=true",
    "curation.caption.clip_score.enabled=true",
    "curation.caption.motion.enabled=true",
    "curation.caption.aesthetic.min_score=-1000",
    "curation.caption.clip_score.min_score=-1",
    "curation.caption.batch_clips=1",
    "curation.caption.decode_workers=0",
]


def _committed(out: Path) -> int:
    units = out / ".units"
    return len([p for p in units.glob("*.jsonl") if ".tmp-" not in p.name]) if units.is_dir() else 0


def _kill_mid_run(command: str, source: Path, out: Path, sets: list[str], total: int) -> int:
    """Run `vidforge COMMAND SOURCE -o OUT` and SIGKILL its whole session once a unit is committed.
    Returns how many units it had committed."""
    cmd = [sys.executable, "-m", "vidforge.cli.app", command, str(source), "-o", str(out)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and _committed(out) < 1:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _committed(out)
    assert 0 < done < total, f"the kill should land mid-run: {done} of {total} units committed"
    return done


def _same_files(a: Path, b: Path, names: list[str]) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _tars(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("*.tar"))


@pytest.fixture(scope="module")
def annotated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("annotated")
    return make_annotated_dir(root / "ann", videos=10, images=2, rejected=1, frames=(9, 12), seed=3)


@OPT_IN
def test_shard_killed_and_rerun_equals_an_uninterrupted_run(annotated, tmp_path):
    from vidforge.text import build_text_encoder

    profile = load_profile(None, DATA_SETS)
    encoder = build_text_encoder(profile)  # once for both in-process runs (random weights, seeded)
    reference = shard_run(profile, annotated, tmp_path / "ref", encoder=encoder)
    _kill_mid_run("shard", annotated, tmp_path / "out", DATA_SETS, reference.shards)
    resumed = shard_run(profile, annotated, tmp_path / "out", encoder=encoder)
    assert resumed.skipped > 0 and resumed.written + resumed.skipped == reference.shards
    assert _tars(tmp_path / "out") == _tars(tmp_path / "ref")
    _same_files(tmp_path / "out", tmp_path / "ref", ["index.json", "manifest.jsonl", "errors.jsonl"])
    _same_files(tmp_path / "out", tmp_path / "ref", _tars(tmp_path / "ref"))


def test_tokenize_killed_and_rerun_equals_an_uninterrupted_run(annotated, tmp_path):
    profile = load_profile(None, DATA_SETS)
    shard_run(profile, annotated, tmp_path / "shards")
    reference = tokenize_run(profile, tmp_path / "shards", tmp_path / "ref")
    _kill_mid_run("tokenize", tmp_path / "shards", tmp_path / "out", DATA_SETS, reference.shards)
    resumed = tokenize_run(profile, tmp_path / "shards", tmp_path / "out")
    assert resumed.skipped > 0 and resumed.written + resumed.skipped == reference.shards
    assert _tars(tmp_path / "out") == _tars(tmp_path / "ref")
    _same_files(tmp_path / "out", tmp_path / "ref", ["index.json", "manifest.jsonl", "errors.jsonl"])
    _same_files(tmp_path / "out", tmp_path / "ref", _tars(tmp_path / "ref"))


@pytest.fixture(scope="module")
def clips_dir(tmp_path_factory, sample_videos, sample_truth) -> Path:
    videos = {sample_videos / t["file"]: t for t in sample_truth.values()}
    return make_clips_dir(tmp_path_factory.mktemp("clips"), videos)


@OPT_IN
def test_caption_killed_and_rerun_equals_an_uninterrupted_run(clips_dir, tmp_path):
    profile = load_profile(None, CAPTION_SETS)
    reference = caption.run(profile, clips_dir, tmp_path / "ref")
    _kill_mid_run("caption", clips_dir, tmp_path / "out", CAPTION_SETS, reference.clips)
    resumed = caption.run(profile, clips_dir, tmp_path / "out")
    assert resumed.skipped > 0 and resumed.clips == reference.clips
    _same_files(tmp_path / "out", tmp_path / "ref", ["manifest.jsonl", "errors.jsonl", "rejected.jsonl"])
    clips = sorted(p.name for p in (tmp_path / "ref" / "clips").iterdir())
    assert sorted(p.name for p in (tmp_path / "out" / "clips").iterdir()) == clips
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["clips"] == reference.clips
