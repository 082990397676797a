"""A source damaged part-way, or whose encode fails, while its shots are being encoded by the recorder's
thread (or its process): the source is one error line, every shot file written for it is deleted (none
is kept: the frames before the damage may already be the decoder's concealment), no thread or process
is left behind, and a batch goes on to the next source.

Real files: a sample video rewritten with its index first (as streamed MP4s are), then cut off halfway,
or one packet's NAL length overwritten (bad bytes mid-file); the same video as Matroska and WebM, cut off
halfway, beside intact ones that must pass (variable frame rate, audio outlasting the video, only the
trailing index missing). The encode fails on a real filesystem error: the recorder's temporary file for
the second shot cannot be created, or (in the recording process) a shot's file grows past the process's
file-size limit (RLIMIT_FSIZE: the muxer's write fails with EFBIG)."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from curation_fixtures import CLIP_OPEN_SETS

from vidforge.curate import clip
from vidforge.curate.clipping.decode import analyse
from vidforge.curate.clipping.shot_recorder import RecordingError
from vidforge.curate.stage import ItemError
from vidforge.data.manifest import TMP_MARK, stable_id
from vidforge.profile import load_profile
from vidforge.profile.curation import Curation


def _remux(source: Path, out: Path, **options: str) -> bytes:
    with av.open(str(source)) as i, av.open(str(out), "w", options=options) as o:
        stream = i.streams.video[0]
        copy = o.add_stream_from_template(stream)
        for packet in i.demux(stream):
            if packet.dts is not None:
                packet.stream = copy
                o.mux(packet)
    return out.read_bytes()


@pytest.fixture(scope="module")
def damaged(sample_videos, tmp_path_factory) -> dict[str, Path]:
    """{"good", "truncated", "bad_bytes"}: cuts.mp4 (114 frames, 4.75 s, 4 shots) and two damaged copies."""
    folder = tmp_path_factory.mktemp("damaged")
    good = folder / "good.mp4"
    data = _remux(sample_videos / "cuts.mp4", good, movflags="faststart")
    assert data.find(b"moov") < data.find(b"mdat")  # the index first, or a cut file would not even open
    (folder / "truncated.mp4").write_bytes(data[: (data.find(b"mdat") + len(data)) // 2])
    with av.open(str(good)) as container:
        packets = [p.pos for p in container.demux(video=0) if p.size]
    bad = bytearray(data)
    bad[packets[len(packets) // 2] : packets[len(packets) // 2] + 4] = b"\xff\xff\xff\xff"  # NAL length
    (folder / "bad_bytes.mp4").write_bytes(bytes(bad))
    return {p.stem: p for p in folder.glob("*.mp4")}


def _frames_before_the_error(path: Path) -> int:
    """What PyAV decodes of `path` (threaded, as the analysis does) before it raises."""
    with av.open(str(path)) as container:
        container.streams.video[0].thread_type = "AUTO"
        frames = 0
        with pytest.raises(av.InvalidDataError):
            for _ in container.decode(video=0):
                frames += 1
    return frames


def _nothing_left(clips: Path) -> None:
    left = [p.name for p in clips.iterdir() if p.is_file()] if clips.exists() else []
    assert not left, left
    assert not [t.name for t in threading.enumerate() if t.name == "shot-encoder"]
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("record_process", [False, True], ids=["encoder thread", "recording process"])
@pytest.mark.parametrize(
    ("name", "reason"),
    [("truncated", "truncated: decodes to "), ("bad_bytes", "damaged after frame {} (")],
)
def test_a_source_damaged_part_way_is_one_error_and_leaves_no_shot(
    damaged, tmp_path, name, reason, record_process
):
    cfg = Curation(stitch=False)
    with pytest.raises(ItemError) as caught:
        analyse(str(damaged[name]), cfg, record_to=tmp_path / "clips", record_process=record_process)
    message = str(caught.value)
    reason = reason.format(_frames_before_the_error(damaged[name])) if "{}" in reason else reason
    assert message.startswith(reason) and "\n" not in message and "Errno" not in message, message
    _nothing_left(tmp_path / "clips")
    # The undamaged file records every shot: the damaged ones had written some before failing.
    assert len(analyse(str(damaged["good"]), cfg, record_to=tmp_path / "good").recorded) == 4


def test_an_encode_failing_mid_source_ends_it_cleanly(damaged, tmp_path):
    source, clips, cfg = str(damaged["good"]), tmp_path / "clips", Curation(stitch=False)
    second = analyse(source, cfg).shots[1].start
    # The recorder's temporary file for the second shot (shot_recorder.py) is taken by a directory.
    blocker = clips / f".shot-{stable_id(source)}-{second}{TMP_MARK}{os.getpid()}.mp4"
    blocker.mkdir(parents=True)
    with pytest.raises(OSError) as caught:  # not the source's fault: the next run tries it again
        analyse(source, cfg, record_to=clips)
    assert not isinstance(caught.value, ItemError) and blocker.name in str(caught.value)
    _nothing_left(clips)  # the first shot, written before, is deleted too


def test_the_batch_goes_on_past_damaged_sources(damaged, tmp_path):
    out = tmp_path / "out"
    run = clip.run(load_profile(None, CLIP_OPEN_SETS), [str(p) for p in damaged.values()], out)
    errors = {
        Path(e["source"]).stem: e for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())
    }
    assert sorted(errors) == ["bad_bytes", "truncated"] and run.partial
    assert all(e["stage"] == "decode" and "\n" not in e["reason"] for e in errors.values())
    records = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert {Path(r["source"]).stem for r in records} == {"good"} and len(records) >= 2
    assert sorted(p.name for p in (out / "clips").iterdir()) == sorted(Path(r["path"]).name for r in records)


def _reencode(source: Path, out: Path, codec: str, durations_ms=(), audio_seconds: float = 0.0) -> bytes:
    """`source`'s frames encoded anew into `out` (the container its suffix names), shown for `durations_ms`
    in turn when given (a variable frame rate), beside `audio_seconds` of silent AAC when given."""
    tb = Fraction(1, 1000)
    with av.open(str(source)) as i, av.open(str(out), "w") as o:
        video_in = i.streams.video[0]
        video = o.add_stream(codec, rate=video_in.average_rate)
        video.width, video.height, video.pix_fmt = video_in.width, video_in.height, "yuv420p"
        if durations_ms:
            video.time_base = video.codec_context.time_base = tb
        audio = o.add_stream("aac", rate=48000, layout="mono") if audio_seconds else None
        shown = 0
        for k, frame in enumerate(i.decode(video_in)):
            frame.pict_type = 0  # the encoder picks its own frame types
            if durations_ms:
                frame.pts, frame.time_base = shown, tb
                shown += durations_ms[k % len(durations_ms)]
            o.mux(video.encode(frame))
        o.mux(video.encode(None))
        for start in range(0, round(48000 * audio_seconds), 1024):
            silence = av.AudioFrame.from_ndarray(
                np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
            )
            silence.sample_rate, silence.pts, silence.time_base = 48000, start, Fraction(1, 48000)
            o.mux(audio.encode(silence))
        if audio is not None:
            o.mux(audio.encode(None))
    return out.read_bytes()


@pytest.fixture(scope="module")
def matroska(sample_videos, tmp_path_factory) -> dict[str, Path]:
    """cuts.mp4 (114 frames, 4.75 s, 4 shots) as Matroska and WebM (VP9), each also cut off halfway; and
    intact files a length check could misread: a variable frame rate (frames shown for 20 and 60 ms in
    turn), the same with its trailing index (the Cues) cut off and every frame still there, and audio
    running 2 s past the video (the Segment's Duration then is the audio's)."""
    folder, cuts = tmp_path_factory.mktemp("matroska"), sample_videos / "cuts.mp4"
    mkv = _remux(cuts, folder / "good.mkv")
    webm = _reencode(cuts, folder / "good.webm", "libvpx-vp9")
    variable = _reencode(cuts, folder / "variable_rate.mkv", "libx264", durations_ms=(20, 60))
    _reencode(cuts, folder / "audio_longer.mkv", "libx264", audio_seconds=6.75)
    (folder / "truncated.mkv").write_bytes(mkv[: len(mkv) // 2])
    (folder / "truncated.webm").write_bytes(webm[: len(webm) // 2])
    index_cut = folder / "variable_rate_index_cut.mkv"
    index_cut.write_bytes(variable[: variable.rfind(b"\x1c\x53\xbb\x6b")])  # the Cues element's ID
    with av.open(str(index_cut)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 114  # only the index is gone
    return {p.name: p for p in folder.iterdir()}


@pytest.mark.parametrize("record_process", [False, True], ids=["encoder thread", "recording process"])
def test_a_cut_off_matroska_source_is_one_error_and_leaves_no_shot(matroska, tmp_path, record_process):
    cfg, clips = Curation(stitch=False), tmp_path / "clips"
    with pytest.raises(ItemError) as caught:
        analyse(str(matroska["truncated.mkv"]), cfg, record_to=clips, record_process=record_process)
    message = str(caught.value)
    assert message.startswith("truncated: decodes to ") and "\n" not in message, message
    assert message.endswith(" of the 4.75 s its header states"), message
    _nothing_left(clips)


def test_a_matroska_source_given_as_a_url_is_held_to_its_header_too(matroska, tmp_path):
    """An fsspec URL (here fsspec's in-memory filesystem) is opened for FFmpeg and for the header the
    same way as a path: the cut file is the same truncated error, the intact one decodes whole."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for name in ("truncated.mkv", "good.mkv"):
        memory.pipe(f"/damaged-url/{name}", matroska[name].read_bytes())
    cfg = Curation(stitch=False)
    with pytest.raises(ItemError, match=r"^truncated: decodes to .* of the 4\.75 s its header states$"):
        analyse("memory://damaged-url/truncated.mkv", cfg)
    assert analyse("memory://damaged-url/good.mkv", cfg).info.duration_s == pytest.approx(4.75, abs=0.05)


def test_cut_off_matroska_sources_fail_and_intact_ones_pass(matroska, tmp_path):
    out = tmp_path / "out"
    run = clip.run(load_profile(None, CLIP_OPEN_SETS), [str(p) for p in matroska.values()], out)
    errors = {Path(e["source"]).name: e["reason"] for e in _lines(out / "errors.jsonl")}
    assert sorted(errors) == ["truncated.mkv", "truncated.webm"] and run.partial, errors
    assert all(r.startswith("truncated: decodes to ") for r in errors.values()), errors
    records = {Path(r["source"]).name: r for r in _lines(out / "manifest.jsonl")}
    assert set(records) == set(matroska) - set(errors)
    assert records["variable_rate.mkv"]["source_variable_rate"] and records["variable_rate_index_cut.mkv"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


_CHILD_FILE_LIMIT: list[int] = []  # bytes a file may grow to in processes forked while it is set


def _limit_files_in_child() -> None:
    if _CHILD_FILE_LIMIT:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), not the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (_CHILD_FILE_LIMIT[0], resource.RLIM_INFINITY))


os.register_at_fork(after_in_child=_limit_files_in_child)


def test_a_shot_the_recording_process_cannot_write_is_retried_not_damage(damaged, tmp_path):
    source, out = str(damaged["good"]), tmp_path / "out"
    profile = load_profile(None, [*CLIP_OPEN_SETS, "curation.record_process=true"])
    _CHILD_FILE_LIMIT.append(1024)  # the recording process's shot files are 2.8-4.3 KB: the first fails
    try:
        failed = clip.run(profile, [source], out)
    finally:
        _CHILD_FILE_LIMIT.clear()
    [error] = _lines(out / "errors.jsonl")
    shot = f".shot-{stable_id(source)}-0{TMP_MARK}"
    assert error["stage"] == "decode" and failed.partial, error
    assert error["reason"].startswith("RecordingError: recording ") and shot in error["reason"], error
    assert "File too large" in error["reason"], error  # the muxer's own write failed, in the child
    _nothing_left(out / "clips")
    # Not the source's fault: the next run, the limit gone, does it again and records its shots.
    again = clip.run(profile, [source], out)
    assert not again.partial and not _lines(out / "errors.jsonl")
    records = _lines(out / "manifest.jsonl")
    assert len(records) >= 2 and again.summary["clips_recorded"] == len(records)


def test_the_analysis_stops_at_once_when_the_recording_process_fails(tmp_path):
    """A long source whose first shot's file cannot be written: the analysing parent learns it from the
    pipe the child closed (at its next push), not after decoding the rest of the source."""
    source = tmp_path / "long.mp4"
    with av.open(str(source), "w") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 32, 16, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for i in range(4000):  # a cut at frame 30, then 2.8 minutes of one slowly changing shot
            picture = np.full((16, 32, 3), 20 if i < 30 else 200, np.uint8)
            picture[:8, :16] += np.uint8(i % 7)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        container.mux(stream.encode(None))
    _CHILD_FILE_LIMIT.append(1024)
    try:
        with pytest.raises(RecordingError) as caught:
            analyse(str(source), Curation(stitch=False), record_to=tmp_path / "clips", record_process=True)
    finally:
        _CHILD_FILE_LIMIT.clear()
    assert f".shot-{stable_id(str(source))}-0{TMP_MARK}" in str(caught.value)
    assert [entry.name for entry in caught.traceback][-2:] == ["push", "_send"]
    _nothing_left(tmp_path / "clips")
