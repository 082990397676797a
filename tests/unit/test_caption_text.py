"""Caption cleaning (cut at a sentence boundary, empty and degenerate flags) and the sidecar captioner's
mapping of source captions to clips by time overlap."""

from __future__ import annotations

import json

import pytest

from vidforge.curate.captioning.captioners import ClipItem, evenly_spaced
from vidforge.curate.captioning.captioners.cleaning import (
    DEGENERATE,
    EMPTY,
    TRUNCATED,
    clean_caption,
    cut_at_sentence,
    longest_run,
)
from vidforge.curate.captioning.captioners.sidecar import Segment, SidecarCaptioner, best_segment
from vidforge.profile.caption import SidecarCaptioner as SidecarSettings


def test_evenly_spaced_includes_both_ends():
    assert evenly_spaced(25, 3) == [0, 12, 24]
    assert evenly_spaced(25, 1) == [12]
    assert evenly_spaced(4, 16) == [0, 1, 2, 3]
    assert evenly_spaced(100, 5) == [0, 25, 50, 74, 99]  # round(i * 99 / 4)


def test_long_caption_is_cut_at_the_last_sentence_end_within_the_limit():
    text = "A dog runs on a beach. It chases a red ball! Then the waves come in slowly and it stops."
    cut, was_cut = cut_at_sentence(text, 50)
    assert (cut, was_cut) == ("A dog runs on a beach. It chases a red ball!", True)
    assert cut_at_sentence(text, len(text)) == (text, False)
    # No sentence ends in time: cut at a word boundary.
    assert cut_at_sentence("one two three four five", 12) == ("one two", True)
    # A decimal point is not a sentence end.
    assert cut_at_sentence("It costs 3.5 dollars and more words follow here", 20)[0] == "It costs 3.5 dollars"


def test_clean_caption_flags():
    long = "A cat sleeps. " * 60
    cleaned = clean_caption(long, max_chars=100)
    assert TRUNCATED in cleaned.flags and len(cleaned.text) <= 100 and cleaned.text.endswith("sleeps.")
    assert clean_caption("  a   red\n square moving  ").text == "a red square moving"
    assert clean_caption("  a   red\n square moving  ").flags == []
    assert clean_caption("").flags == [EMPTY]
    assert clean_caption(None).flags == [EMPTY]
    assert clean_caption("... !!").flags == [EMPTY]
    assert clean_caption("a man a man a man a man walking").flags == [DEGENERATE]  # a phrase looping
    assert clean_caption("the the the the dog").flags == [DEGENERATE]
    assert clean_caption("dog " * 3 + "cat dog bird dog fish dog").flags == [DEGENERATE]  # one word dominates
    assert clean_caption("a dog and a cat and a bird on a sofa").flags == []


def test_longest_run_matches_a_direct_count():
    words = "x y x y x y z z".split()
    assert longest_run(words) == 3  # "x y" three times
    assert longest_run(["a"]) == 1 and longest_run([]) == 0


def test_best_segment_by_overlap():
    segs = [Segment(0.0, 2.0, "first"), Segment(2.0, 5.0, "second"), Segment(5.0, float("inf"), "rest")]
    assert best_segment(segs, 0.5, 1.5, 0.5).text == "first"
    assert best_segment(segs, 1.5, 3.0, 0.5).text == "second"  # 1.0 of 1.5 s in the second
    assert best_segment(segs, 1.0, 3.0, 0.5).text == "first"  # a tie goes to the earlier
    assert best_segment(segs, 6.0, 9.0, 0.5).text == "rest"
    assert best_segment([Segment(0.0, 1.0, "short")], 0.0, 4.0, 0.5) is None  # covers only a quarter


def _item(source, start, end):
    return ClipItem("c", {"source": str(source), "start_s": start, "end_s": end}, num_frames=0)


def test_sidecar_json_next_to_the_video(sample_videos, sample_truth):
    captioner = SidecarCaptioner(SidecarSettings())
    captioner.setup()
    truth = sample_truth["cuts"]
    items = []
    for scene in truth["scenes"]:  # a clip inside each scene, trimmed a little at both ends
        items.append(_item(sample_videos / truth["file"], scene["start_s"] + 0.1, scene["end_s"] - 0.1))
    results = captioner.caption(items)
    assert [r.text for r in results] == [s["caption"] for s in truth["scenes"]]
    assert all(r.source == "sidecar:json" and r.error is None for r in results)
    # A clip that straddles two scenes takes the one it overlaps most.
    s0, s1 = truth["scenes"][0], truth["scenes"][1]
    [r] = captioner.caption([_item(sample_videos / truth["file"], s0["end_s"] - 0.2, s0["end_s"] + 0.5)])
    assert r.text == s1["caption"]
    # No sidecar: an error for that clip only.
    [r] = captioner.caption([_item(sample_videos / "missing.mp4", 0, 1)])
    assert r.text is None and "no caption sidecar" in r.error


def test_sidecar_csv_with_and_without_times(tmp_path):
    (tmp_path / "videos").mkdir()
    csv_path = tmp_path / "captions.csv"
    csv_path.write_text(
        "path,caption,start,end\n"
        "videos/a.mp4,a whole video about a cat,,\n"
        "videos/b.mp4,a dog runs,0,3\n"
        'videos/b.mp4,"a dog sleeps, quietly",3,\n'
    )
    captioner = SidecarCaptioner(SidecarSettings(path=str(csv_path)))
    captioner.setup()
    results = captioner.caption(
        [
            _item(tmp_path / "videos" / "a.mp4", 10, 12),
            _item(tmp_path / "videos" / "b.mp4", 0.5, 2.5),
            _item("/elsewhere/b.mp4", 4, 8),  # matched by file name
            _item(tmp_path / "videos" / "c.mp4", 0, 1),
        ]
    )
    assert [r.text for r in results] == [
        "a whole video about a cat",
        "a dog runs",
        "a dog sleeps, quietly",
        None,
    ]
    assert results[0].source == "sidecar:captions.csv"


def test_sidecar_csv_needs_its_columns(tmp_path):
    from vidforge.errors import UserInputError

    bad = tmp_path / "bad.csv"
    bad.write_text("video,text\na.mp4,x\n")
    with pytest.raises(UserInputError, match="path,caption"):
        SidecarCaptioner(SidecarSettings(path=str(bad))).setup()


def test_sidecar_json_reads_open_ended_segments(tmp_path):
    (tmp_path / "v.mp4").write_bytes(b"")
    (tmp_path / "v.captions.json").write_text(json.dumps([{"start": 0, "end": None, "text": "all of it"}]))
    captioner = SidecarCaptioner(SidecarSettings())
    [r] = captioner.caption([_item(tmp_path / "v.mp4", 100, 101)])
    assert r.text == "all of it"


def test_sidecar_reads_a_txt_beside_the_video_as_finetune_does(tmp_path):
    """`<video>.txt` (finetune's, finetrainers' and musubi-tuner's caption file) captions every clip of the
    video; a `.captions.json` beside it, with times, wins."""
    (tmp_path / "v.mp4").write_bytes(b"")
    (tmp_path / "v.txt").write_text("a cat on the grass\n")
    captioner = SidecarCaptioner(SidecarSettings())
    assert [r.text for r in captioner.caption([_item(tmp_path / "v.mp4", 0, 2)])] == ["a cat on the grass"]
    (tmp_path / "v.captions.json").write_text(json.dumps([{"start": 0, "end": None, "text": "timed"}]))
    fresh = SidecarCaptioner(SidecarSettings())
    assert [r.text for r in fresh.caption([_item(tmp_path / "v.mp4", 0, 2)])] == ["timed"]
