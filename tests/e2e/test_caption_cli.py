"""`vidforge caption` end to end on the sample videos, each taken as one clip of a clip-stage output
(sidecar captions, a tiny random CLIP, motion): the output contract, the decisions, an undecodable clip
recorded as an error while the batch goes on, reruns/resumes producing the same files, --retry-errors,
a wrong profile refused before any model loads, the real `vidforge clip` -> `vidforge caption` chain,
and Ray giving the same files as the local executor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from curation_fixtures import SETTINGS, make_clips_dir  # noqa: E402

from vidforge.cli.app import app  # noqa: E402

runner = CliRunner()


@pytest.fixture
def clips_dir(tmp_path, sample_videos, sample_truth):
    """A stand-in for a `vidforge clip` output: each sample video whole as one clip, plus a corrupt one."""
    return make_clips_dir(tmp_path / "clips_run", sample_videos, sample_truth)


def _run(clips, out, *extra):
    args = ["--json", "caption", str(clips), "-o", str(out)]
    for s in SETTINGS:
        args += ["--set", s]
    return runner.invoke(app, args + list(extra), catch_exceptions=False)


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # about 25 s here: two runs, with the decode process pool
def test_caption_cli_end_to_end(clips_dir, tmp_path, sample_truth):
    out = tmp_path / "captioned"
    result = _run(clips_dir, out)
    assert result.exit_code == 3, result.output  # one clip failed: partial success
    lines = [json.loads(line) for line in result.output.splitlines()]
    summary = lines[-1]
    assert summary["event"] == "result" and summary["clips"] == 6 and summary["errors"] == 1

    inputs = {r["clip_id"]: r for r in _read(clips_dir / "manifest.jsonl")}
    manifest = {r["clip_id"]: r for r in _read(out / "manifest.jsonl")}
    assert set(manifest) == set(inputs)
    by_name = {}
    for cid, rec in manifest.items():
        for key, value in inputs[cid].items():  # every field of the clip record is carried
            if key != "media":
                assert rec[key] == value
        for key in (
            "caption",
            "caption_source",
            "aesthetic",
            "text_area",
            "texty_frames",
            "motion",
            "clip_score",
            "keep",
            "reasons",
            "media",
        ):
            assert key in rec
        assert rec["random_weights"] is True
        by_name[os.path.basename(rec["source"]).removesuffix(".mp4") if rec.get("frames") else "broken"] = rec

    # Captions from the sidecars, by overlap (each clip is a whole one-scene video or the first scene wins).
    for name in ("red_square", "motion_static", "motion_slow", "motion_fast"):
        assert by_name[name]["caption"] == sample_truth[name]["scenes"][0]["caption"]
        assert by_name[name]["caption_source"] == "sidecar:json"
    # Motion decides: the static clip is rejected, the moving ones kept.
    assert by_name["motion_static"]["reasons"] == ["too_static"] and not by_name["motion_static"]["keep"]
    for name in ("motion_slow", "motion_fast", "red_square"):
        assert by_name[name]["keep"] and by_name[name]["reasons"] == [], by_name[name]
    assert (
        by_name["motion_static"]["motion"]
        < by_name["motion_slow"]["motion"]
        < by_name["motion_fast"]["motion"]
    )
    # The undecodable clip: an error, rejected, the others done.
    broken = by_name["broken"]
    assert broken["keep"] is False and broken["reasons"] == ["error:decode"]
    [err] = _read(out / "errors.jsonl")
    assert err["clip_id"] == broken["clip_id"] and err["step"] == "decode"

    # Media linked into OUT (hard links on one filesystem).
    for cid, rec in manifest.items():
        if rec is broken:
            continue
        target = out / rec["media"]
        assert rec["media"] == f"clips/{cid}.mp4" and target.is_file()
        assert os.path.samefile(target, clips_dir / inputs[cid]["media"])
        with av.open(str(target)) as c:
            assert c.streams.video[0].frames > 0

    rejected = _read(out / "rejected.jsonl")
    assert {r["clip_id"] for r in rejected} == {c for c, r in manifest.items() if not r["keep"]}
    saved = json.loads((out / "summary.json").read_text())
    assert saved["by_reason"]["too_static"] == sum("too_static" in r["reasons"] for r in manifest.values())
    assert saved["kept"] + saved["rejected"] == 6
    assert (out / "histograms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A rerun does nothing new and writes the same files.
    before = {p: (out / p).read_bytes() for p in ("manifest.jsonl", "errors.jsonl", "rejected.jsonl")}
    again = _run(clips_dir, out)
    assert json.loads(again.output.splitlines()[-1])["skipped"] == 6
    assert {p: (out / p).read_bytes() for p in before} == before


def test_caption_resume_matches_an_uninterrupted_run(clips_dir, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _run(clips_dir, whole)
    first = _run(clips_dir, resumed, "--limit", "3")  # stands in for a run killed after three clips
    assert json.loads(first.output.splitlines()[-1])["clips"] == 3
    _run(clips_dir, resumed)
    assert (resumed / "manifest.jsonl").read_bytes() == (whole / "manifest.jsonl").read_bytes()
    assert (resumed / "errors.jsonl").read_bytes() == (whole / "errors.jsonl").read_bytes()


def test_caption_cli_user_errors(tmp_path):
    result = runner.invoke(app, ["caption", str(tmp_path), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "manifest.jsonl" in result.output


def test_retry_errors_redoes_failed_clips_only(clips_dir, tmp_path, sample_videos):
    out = tmp_path / "retry"
    assert _run(clips_dir, out, "--set", "curation.caption.decode_workers=0").exit_code == 3
    [err] = _read(out / "errors.jsonl")
    shutil.copy(sample_videos / "red_square.mp4", clips_dir / "clips" / f"{err['clip_id']}.mp4")  # fixed
    again = _run(clips_dir, out, "--set", "curation.caption.decode_workers=0")
    assert again.exit_code == 3 and json.loads(again.output.splitlines()[-1])["skipped"] == 6  # still skipped
    retried = _run(clips_dir, out, "--set", "curation.caption.decode_workers=0", "--retry-errors")
    assert retried.exit_code == 0, retried.output
    summary = json.loads(retried.output.splitlines()[-1])
    assert summary["retried"] == 1 and summary["skipped"] == 5 and summary["errors"] == 0
    assert (out / "errors.jsonl").read_text() == ""
    row = {r["clip_id"]: r for r in _read(out / "manifest.jsonl")}[err["clip_id"]]
    assert row["caption"] == "a red square moving right" and "error:decode" not in row["reasons"]


def test_a_clip_whose_annotation_raises_is_an_error_and_the_batch_goes_on(clips_dir, tmp_path, monkeypatch):
    """A failure outside the per-step guards (here: the whole annotate call) costs only its clip."""
    from vidforge.curate.captioning.annotator import CaptionAnnotator

    victim = _read(clips_dir / "manifest.jsonl")[1]["clip_id"]
    real = CaptionAnnotator.annotate

    def annotate(self, decoded):
        if any(d.record["clip_id"] == victim for d in decoded):
            raise RuntimeError("model call failed")
        return real(self, decoded)

    monkeypatch.setattr(CaptionAnnotator, "annotate", annotate)
    out = tmp_path / "raising"
    result = _run(clips_dir, out, "--set", "curation.caption.decode_workers=0")
    assert result.exit_code == 3
    errors = {e["clip_id"]: e for e in _read(out / "errors.jsonl")}
    assert errors[victim]["step"] == "annotate" and "model call failed" in errors[victim]["reason"]
    assert len(errors) == 2  # the victim and the undecodable clip; its batch neighbour went on
    rows = {r["clip_id"]: r for r in _read(out / "manifest.jsonl")}
    assert len(rows) == 6 and rows[victim]["reasons"] == ["error:annotate"]
    assert sum(r["keep"] for r in rows.values()) >= 3


def test_bad_ocr_folder_is_refused_before_any_model_loads(clips_dir, tmp_path):
    """In a fresh interpreter: exit 2 with the setting named, quickly, and torch never imported (so no
    model was built)."""
    code = (
        "import sys, time\n"
        "from typer.testing import CliRunner\n"
        "from vidforge.cli.app import app\n"
        "t = time.perf_counter()\n"
        f"r = CliRunner().invoke(app, ['caption', {str(clips_dir)!r}, '-o', {str(tmp_path / 'o')!r},\n"
        "    '--set', 'curation.caption.ocr.enabled=true', '--set', 'curation.caption.ocr.model_dir=/no/such/dir',\n"
        "    '--set', 'curation.caption.random_weights=true', '--set', 'curation.caption.clip.model=ViT-L-14'])\n"
        "print(r.exit_code, round(time.perf_counter() - t, 2), 'torch' in sys.modules, 'open_clip' in sys.modules)\n"
        "print(r.output)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    first, *rest = proc.stdout.splitlines()
    exit_code, seconds, torch_loaded, open_clip_loaded = first.split()
    assert exit_code == "2" and "curation.caption.ocr.model_dir" in "\n".join(rest), proc.stdout + proc.stderr
    # what makes the refusal quick, without a wall-clock bound that a busy machine breaks: no model code loaded
    assert torch_loaded == "False" and open_clip_loaded == "False", seconds


def _scene_caption(truth: dict, start_s: float, end_s: float) -> str:
    """The scene covering most of [start_s, end_s), from the generator's ground truth."""
    best = max(truth["scenes"], key=lambda s: min(end_s, s["end_s"]) - max(start_s, s["start_s"]))
    return best["caption"]


def test_clip_then_caption_takes_sidecar_captions_by_time_overlap(tmp_path, sample_videos, sample_truth):
    """The real chain: `vidforge clip` on sample videos, then `vidforge caption` on its output."""
    clips_out, captioned = tmp_path / "clips", tmp_path / "captioned"
    names = ["cuts", "static"]
    args = ["--json", "clip", *(str(sample_videos / f"{n}.mp4") for n in names), "-o", str(clips_out)]
    for s in (
        "curation.stitch=false",
        "curation.embed=false",
        "curation.decode_workers=0",
        "curation.transcode_workers=0",
    ):
        args += ["--set", s]
    clip_result = runner.invoke(app, args, catch_exceptions=False)
    assert clip_result.exit_code == 0, clip_result.output
    result = _run(clips_out, captioned)
    assert result.exit_code == 0, result.output
    rows = _read(captioned / "manifest.jsonl")
    clips = _read(clips_out / "manifest.jsonl")
    assert sorted(r["clip_id"] for r in rows) == sorted(c["clip_id"] for c in clips) and len(rows) >= 5
    for row in rows:
        truth = sample_truth[os.path.basename(row["source"]).removesuffix(".mp4")]
        assert row["caption"] == _scene_caption(truth, row["start_s"], row["end_s"]), row
        assert row["caption_source"] == "sidecar:json"
        assert os.path.samefile(captioned / row["media"], clips_out / row["path"])
    captions = {r["caption"] for r in rows}
    assert {"a yellow circle moving down", "a magenta triangle moving left"} <= captions


@pytest.mark.slow
def test_ray_executor_gives_the_same_manifest(clips_dir, tmp_path):
    pytest.importorskip("ray")
    local, ray_out = tmp_path / "local", tmp_path / "ray"
    assert _run(clips_dir, local).exit_code == 3
    result = _run(clips_dir, ray_out, "--executor", "ray")
    assert result.exit_code == 3, result.output
    summary = json.loads(result.output.splitlines()[-1])
    assert summary["executor"] == "ray" and [s["stage"] for s in summary["stages"]] == ["decode", "annotate"]
    for name in ("manifest.jsonl", "errors.jsonl", "rejected.jsonl"):
        assert (ray_out / name).read_text() == (local / name).read_text(), name
    assert _run(clips_dir, ray_out, "--executor", "ray").exit_code == 3  # a rerun: a no-op
    assert (ray_out / "manifest.jsonl").read_text() == (local / "manifest.jsonl").read_text()
