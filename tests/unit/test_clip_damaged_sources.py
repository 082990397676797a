"""A source damaged part-way, or whose encode fails, while its shots are being encoded by the recorder's
thread (or its process): the source is one error line, every shot file written for it is deleted (none
is kept: the frames before the damage may already be the decoder's concealment), no thread or process
is left behind, and a batch goes on to the next source.

Real files: a sample video rewritten with its index first (as streamed MP4s are), then cut off halfway,
or one packet's NAL length overwritten (bad bytes mid-file); the encode fails on a real filesystem error
(the recorder's temporary file for the second shot cannot be created)."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from pathlib import Path

import av
import pytest
from curation_fixtures import CLIP_OPEN_SETS

from vidforge.curate import clip
from vidforge.curate.clipping.decode import analyse
from vidforge.curate.stage import ItemError
from vidforge.data.manifest import TMP_MARK, stable_id
from vidforge.profile import load_profile
from vidforge.profile.curation import Curation


def _index_first(source: Path, out: Path) -> bytes:
    with av.open(str(source)) as i, av.open(str(out), "w", options={"movflags": "faststart"}) as o:
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
    data = _index_first(sample_videos / "cuts.mp4", good)
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
