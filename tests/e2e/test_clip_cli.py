"""`vidforge clip` end to end on the sample videos: stitching follows similarity, the static shot goes,
clips hold exactly their frames, reruns are no-ops, a killed run resumes to the same manifest, bad
inputs are recorded and the batch goes on, Ray gives the same manifest as the local executor, and
`vidforge review` shows the kept clips and the dropped shots (in headless Chromium)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.curate import clip
from vidforge.curate.clipping.decode import analyse
from vidforge.curate.clipping.stitch import boundary_similarity
from vidforge.curate.embeddings.embedder import ImageEmbedder
from vidforge.data.embeddings import EmbeddingStore
from vidforge.profile import load_profile

FAST = ["curation.decode_workers=0", "curation.transcode_workers=0"]  # inline: no process start-up in tests


def _profile(*overrides):
    return load_profile(None, [*FAST, *overrides])


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def _decode(path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24").astype(np.int16) for f in c.decode(video=0)]


@pytest.fixture(scope="module")
def stitch_threshold(sample_videos) -> float:
    """Between the false cut's similarity and the true cut's, both measured independently here with the
    same (random-weight) embedder on frames decoded by our analysis: the merge must follow it."""
    cfg = _profile("curation.stitch=true").curation
    embedder = ImageEmbedder.from_profile(cfg)
    a = analyse(str(sample_videos / "false_split.mp4"), cfg)
    false_cut, true_cut = [
        boundary_similarity(x, y, a.boundary, 8, embedder.pooled)
        for x, y in zip(a.shots[:-1], a.shots[1:], strict=True)
    ]
    assert false_cut > true_cut + 0.05, "the sample's false cut must look more alike than its true cut"
    return (false_cut + true_cut) / 2


@pytest.fixture(scope="module")
def curated(tmp_path_factory, sample_videos, stitch_threshold) -> Path:
    out = tmp_path_factory.mktemp("curated")
    names = ["cuts", "static", "false_split", "red_square"]
    clip.run(
        _profile("curation.stitch=true", f"curation.stitch_threshold={stitch_threshold}"),
        [str(sample_videos / f"{n}.mp4") for n in names],
        out,
    )
    return out


def test_shard_on_a_clip_output_says_to_caption_first(curated, tmp_path):
    result = CliRunner().invoke(app, ["shard", str(curated), "-o", str(tmp_path / "shards")])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"run `vidforge caption {curated} -o CAPTIONED` first" in line
    shards = tmp_path / "shards"  # refused before any shard or index was written
    assert not list(shards.glob("*.tar")) and not (shards / "index.json").exists()


def test_false_split_merges_and_true_cut_stays(curated, sample_truth):
    truth = sample_truth["false_split"]
    spans = [
        (r["start_frame"], r["end_frame"], r["stitched"])
        for r in _records(curated)
        if r["source"].endswith("false_split.mp4")
    ]
    assert spans == [(0, truth["cuts"][0], True), (truth["cuts"][0], truth["frames"], False)]


def test_static_shot_is_dropped_with_its_ratio(curated, sample_truth):
    ((s, e),) = sample_truth["static"]["static_spans"]
    kept = [
        (r["start_frame"], r["end_frame"]) for r in _records(curated) if r["source"].endswith("static.mp4")
    ]
    assert (0, 30) in kept
    assert all(b <= s or a >= e for a, b in kept)  # nothing kept overlaps the frozen span
    rejected = [json.loads(x) for x in (curated / "rejected.jsonl").read_text().splitlines()]
    static = [r for r in rejected if r["stage"] == "static"]
    assert len(static) == 1 and static[0]["start_frame"] == 30 and static[0]["end_frame"] >= e
    # frames s..e-1 repeat their predecessor; the clip's first frame is not counted (it follows a cut)
    expected = (e - s) / (static[0]["end_frame"] - 30 - 1)
    assert static[0]["static_ratio"] == pytest.approx(expected, abs=1e-3) and expected > 0.3


def test_review_page_shows_kept_clips_and_dropped_shots(curated, browser, tmp_path):
    page = tmp_path / "review"
    result = CliRunner().invoke(app, ["--json", "review", str(curated), "-o", str(page)])
    assert result.exit_code == 0, result.output
    browser.open((page / "index.html").as_uri())
    items = "[...document.querySelectorAll('#items .item')]"
    rejected = [json.loads(x) for x in (curated / "rejected.jsonl").read_text().splitlines()]
    rows = browser.js(f"{items}.map(r => [r.dataset.id, r.dataset.keep])")
    assert rows == [[r["clip_id"], "true"] for r in _records(curated)] + [
        [r["clip_id"], "false"] for r in rejected
    ]
    browser.wait_for("[...document.images].every(i => i.complete)")
    strips = browser.js(f"{items}.map(r => (r.querySelector('img') || {{}}).naturalWidth > 0)")
    assert strips == [True] * len(_records(curated)) + [False] * len(rejected)  # dropped shots have no file
    # The histograms of the clip stage's scores, with the thresholds the run kept clips by.
    cfg = _profile().curation
    thresholds = json.loads((curated / "summary.json").read_text())["thresholds"]
    assert thresholds == {
        "static_ratio": [cfg.static_max_ratio],
        "duration_s": [cfg.min_seconds, cfg.max_seconds],
    }
    assert browser.js("[...document.querySelectorAll('#plots img')].map(i => i.naturalWidth > 0)") == [True]
    browser.click('[data-filter="static"]')
    shown = browser.js(f"{items}.map(r => [r.dataset.id, r.querySelector('.detail').textContent])")
    assert shown == [[r["clip_id"], r["reason"]] for r in rejected if r["stage"] == "static"] and shown


def test_clips_hold_exactly_their_frames(curated, sample_videos):
    records = _records(curated)
    assert len(records) >= 6
    sources = {}
    for r in records:
        frames = _decode(curated / r["path"])
        assert len(frames) == r["frames"] == r["end_frame"] - r["start_frame"]
        src = sources.setdefault(r["source"], _decode(r["source"]))
        first, start = frames[0], r["start_frame"]
        err_here = np.abs(first - src[start]).mean()
        assert err_here < 4.0, r  # re-encoding loses a little
        if start > 0:  # and it is not the previous shot's last frame
            assert err_here < np.abs(first - src[start - 1]).mean()
        assert np.abs(frames[-1] - src[r["end_frame"] - 1]).mean() < 4.0


def test_manifest_and_embeddings_are_row_aligned(curated):
    records = _records(curated)
    emb = np.load(curated / "embeddings.npy")
    assert emb.shape[0] == len(records) and [r["embedding_row"] for r in records] == list(range(len(records)))
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert len({r["clip_id"] for r in records}) == len(records)
    summary = json.loads((curated / "summary.json").read_text())
    assert summary["clips"] == len(records) and summary["errors"] == 0


def test_recorded_shots_equal_clips_cut_from_the_source(tmp_path, sample_videos, stitch_threshold):
    """record_shots (one decode a source) and cutting every clip from the source afterwards (the
    reference: two decodes) give the same manifest, embeddings and clip frames; every clip that is a
    whole shot came from a recording, the stitched one was cut from the source."""
    sources = [str(sample_videos / f"{n}.mp4") for n in ("cuts", "false_split")]
    common = ("curation.stitch=true", f"curation.stitch_threshold={stitch_threshold}")
    runs = {
        flag: clip.run(_profile(*common, f"curation.record_shots={flag}"), sources, tmp_path / flag)
        for flag in ("true", "false")
    }
    recorded, reference = _records(tmp_path / "true"), _records(tmp_path / "false")
    assert recorded == reference and any(r["stitched"] for r in recorded)
    assert runs["false"].summary["clips_recorded"] == 0
    assert runs["true"].summary["clips_recorded"] == sum(not r["stitched"] for r in recorded) >= 3
    assert np.array_equal(
        np.load(tmp_path / "true/embeddings.npy"), np.load(tmp_path / "false/embeddings.npy")
    )
    for r in recorded:
        ours, theirs = _decode(tmp_path / "true" / r["path"]), _decode(tmp_path / "false" / r["path"])
        assert len(ours) == len(theirs) == r["frames"]
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True)), r["clip_id"]
    assert sorted(p.name for p in (tmp_path / "true/clips").iterdir()) == sorted(
        Path(r["path"]).name for r in recorded
    )  # no recording left behind


def test_rerun_is_a_no_op(curated, sample_videos, stitch_threshold):
    before = {
        p: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(curated.rglob("*"))
        if p.is_file() and p.name != "summary.json"
    }
    names = ["cuts", "static", "false_split", "red_square"]
    run = clip.run(
        _profile("curation.stitch=true", f"curation.stitch_threshold={stitch_threshold}"),
        [str(sample_videos / f"{n}.mp4") for n in names],
        curated,
    )
    assert run.summary["sources_skipped"] == 4 and run.stages == []
    after = {
        p: p.read_bytes() for p in sorted(curated.rglob("*")) if p.is_file() and p.name != "summary.json"
    }
    assert {p: b for p, (b, _) in before.items()} == after
    assert all(p.stat().st_mtime_ns == before[p][1] for p in before if "clips" in p.parts)


def test_dedup_drops_near_duplicate_clips(tmp_path, sample_videos):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(sample_videos / "red_square.mp4", src / "a.mp4")
    shutil.copy(sample_videos / "red_square.mp4", src / "b.mp4")
    run = clip.run(_profile("curation.stitch=false"), [str(src)], tmp_path / "out", dedup=0.999)
    assert run.summary["clips"] == 1 and run.summary["rejected"] == {"dedup": 1}
    assert len(np.load(tmp_path / "out" / "embeddings.npy")) == 1
    # The store (what `vidforge dedup` and `search` read) holds the kept clip only.
    store = EmbeddingStore.open(tmp_path / "out")
    assert store.ids().tolist() == [r["clip_id"] for r in _records(tmp_path / "out")]


# -- bad input -------------------------------------------------------------------------------------------


def _write(path, w=32, h=16, n=30, vfr=False, audio_only=False):
    tb = Fraction(1, 96)
    with av.open(str(path), "w") as c:
        if audio_only:
            s = c.add_stream("aac", rate=8000)
            for i in range(4):
                f = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                f.sample_rate, f.pts = 8000, i * 1024
                c.mux(s.encode(f))
            c.mux(s.encode(None))
            return path
        s = c.add_stream("libx264", rate=24)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.time_base = tb
        s.codec_context.time_base = tb
        s.options = {"bframes": "0"}
        t = 0
        for i in range(n):
            img = np.zeros((h, w, 3), np.uint8)
            img[:, : w // 2] = (200, 30, 30)
            img[: h // 2] += np.uint8(i)  # a slow change: no cut, not static
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = t, tb
            t += 4 if not vfr else (2 if i % 2 else 6)
            c.mux(s.encode(f))
        c.mux(s.encode(None))
    return path


def _rotate_90(path):
    """Set a 90° display matrix in the track header (what phones write)."""
    b = bytearray(path.read_bytes())
    identity = struct.pack(">9i", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
    j = b.index(identity, b.index(b"tkhd"))
    b[j : j + 36] = struct.pack(">9i", 0, 0x10000, 0, -0x10000, 0, 0, 0, 0, 0x40000000)
    path.write_bytes(bytes(b))
    return path


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, sample_videos) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "zero.mp4").write_bytes(b"")
    (d / "random.mp4").write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    good = (sample_videos / "cuts.mp4").read_bytes()
    (d / "truncated.mp4").write_bytes(good[: len(good) // 2])
    _write(d / "audio.m4a", audio_only=True)
    (d / "audio.mp4").write_bytes((d / "audio.m4a").read_bytes())
    (d / "audio.m4a").unlink()
    _write(d / "tiny.mp4", 16, 16)
    _write(d / "vfr.mp4", vfr=True)
    _rotate_90(_write(d / "rotated.mp4", 32, 16))
    codec = bytearray(_write(d / "codec.mp4").read_bytes())
    i = codec.index(b"avc1", codec.index(b"stsd"))  # the sample entry, not the brand in ftyp
    codec[i : i + 4] = b"zzzz"  # a codec no decoder knows
    (d / "codec.mp4").write_bytes(bytes(codec))
    _write(d / "large.mp4", 1920, 1088, n=24)
    return d


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory, bad_inputs):
    out = tmp_path_factory.mktemp("bad_out")
    run = clip.run(
        _profile("curation.stitch=false", "curation.min_seconds=0.5", "curation.static_max_ratio=1"),
        [str(bad_inputs)],
        out,
    )
    errors = {
        Path(e["source"]).name: e for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())
    }
    return run, errors, {Path(r["source"]).name: r for r in _records(out)}, out


@pytest.mark.parametrize(
    ("name", "stage", "reason"),
    [
        ("zero.mp4", "decode", "cannot open"),
        ("random.mp4", "decode", "cannot open"),
        ("truncated.mp4", "decode", "cannot open"),
        ("audio.mp4", "decode", "no video stream"),
        ("codec.mp4", "decode", "unsupported codec"),
    ],
)
def test_bad_input_is_recorded_with_stage_and_reason(bad_run, name, stage, reason):
    _, errors, records, _ = bad_run
    assert name not in records
    assert errors[name]["stage"] == stage and reason in errors[name]["reason"]
    assert "\n" not in errors[name]["reason"]


def test_odd_inputs_are_processed_correctly(bad_run):
    run, errors, records, out = bad_run
    assert run.partial and run.summary["errors"] == 5 and run.summary["clips"] == 4
    tiny, vfr, rotated, large = (records[n] for n in ("tiny.mp4", "vfr.mp4", "rotated.mp4", "large.mp4"))
    assert (tiny["width"], tiny["height"], tiny["frames"]) == (16, 16, 30)
    assert vfr["frames"] == 30 and len(_decode(out / vfr["path"])) == 30
    assert (rotated["width"], rotated["height"]) == (16, 32)  # displayed upright
    upright = _decode(out / rotated["path"])[0]
    assert upright.shape[:2] == (32, 16)
    assert upright[:16, :, 0].mean() > 150 and upright[16:, :, 0].mean() < 60  # the red half is on top
    assert (large["width"], large["height"], large["frames"]) == (1920, 1088, 24)


# -- command line ------------------------------------------------------------------------------------------


def test_cli_json_summary_and_partial_exit_code(tmp_path, sample_videos, bad_inputs):
    out = tmp_path / "o"
    args = [
        "--json",
        "clip",
        str(sample_videos / "red_square.mp4"),
        str(bad_inputs / "zero.mp4"),
        "-o",
        str(out),
        *[x for s in FAST for x in ("--set", s)],
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3, result.output
    lines = [json.loads(x) for x in result.output.splitlines() if x.startswith("{")]
    final = [x for x in lines if x["event"] == "result"][-1]
    assert final["clips"] == 1 and final["errors"] == 1
    ok = CliRunner().invoke(
        app,
        [
            "--json",
            "clip",
            str(sample_videos / "red_square.mp4"),
            "-o",
            str(tmp_path / "p"),
            *[x for s in FAST for x in ("--set", s)],
        ],
    )
    assert ok.exit_code == 0, ok.output


def test_cli_user_errors_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["clip", str(tmp_path / "nope.mp4"), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no such file" in result.output
    result = CliRunner().invoke(
        app, ["clip", str(tmp_path), "-o", str(tmp_path / "o"), "--set", "curation.embed_model=not-a-model"]
    )
    assert result.exit_code == 2


@pytest.mark.slow  # ~20 s: starts the CLI (and its worker processes) twice
def test_killed_run_resumes_to_the_same_manifest(tmp_path, sample_videos, stitch_threshold):
    sets = ["curation.stitch=true", f"curation.stitch_threshold={stitch_threshold}", "curation.embed=false"]
    reference = tmp_path / "ref"
    clip.run(_profile(*sets), [str(sample_videos)], reference)
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "vidforge.cli.app",
        "clip",
        str(sample_videos),
        "-o",
        str(out),
        *[x for s in sets for x in ("--set", s)],
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and _committed(out) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = _committed(out)
    assert 0 < done_before < 8, "the kill should land mid-run"
    clip.run(_profile(*sets), [str(sample_videos)], out)
    assert (out / "manifest.jsonl").read_text() == (reference / "manifest.jsonl").read_text()
    assert (out / "errors.jsonl").read_text() == (reference / "errors.jsonl").read_text()
    assert sorted(p.name for p in (out / "clips").iterdir()) == sorted(
        p.name for p in (reference / "clips").iterdir()
    )


def _committed(out: Path) -> int:
    units = out / ".units"
    return len([p for p in units.glob("*.jsonl") if ".tmp-" not in p.name]) if units.is_dir() else 0


@pytest.mark.slow
def test_ray_executor_gives_the_same_manifest(tmp_path, sample_videos, curated, stitch_threshold):
    pytest.importorskip("ray")
    names = ["cuts", "static", "false_split", "red_square"]
    out = tmp_path / "ray"
    clip.run(
        load_profile(None, ["curation.stitch=true", f"curation.stitch_threshold={stitch_threshold}"]),
        [str(sample_videos / f"{n}.mp4") for n in names],
        out,
        executor="ray",
    )
    assert (out / "manifest.jsonl").read_text() == (curated / "manifest.jsonl").read_text()
    assert np.array_equal(np.load(out / "embeddings.npy"), np.load(curated / "embeddings.npy"))


def test_clip_files_are_named_after_their_source_and_index(curated) -> None:
    """A person browsing the folder sees which source and which shot (scenedetect's VIDEO-Scene-001)."""
    records = [json.loads(line) for line in (curated / "manifest.jsonl").read_text().splitlines()]
    assert records
    for record in records:
        name = Path(record["path"]).name
        stem = Path(record["source"]).stem
        assert name.startswith(f"{stem}-Scene-") and name.endswith(f"-{record['clip_id']}.mp4"), name
        assert (curated / record["path"]).is_file()
    by_source: dict[str, list[int]] = {}
    for record in records:
        by_source.setdefault(record["source"], []).append(
            int(Path(record["path"]).name.split("-Scene-")[1][:3])
        )
    for indices in by_source.values():
        assert len(set(indices)) == len(indices)  # one index per clip of a source
