"""The caption stage's embedding store, through the real stages: `vidforge clip` on two generated videos of
the same scenes (a re-upload: the same pictures, other camera grain), `vidforge caption` with its tiny
random CLIP, then `vidforge dedup --keep aesthetic` on the caption output keeps, of each twin pair, the
clip with the higher aesthetic score in the caption manifest, and `vidforge search --captions` finds the
clips of a scene by their caption."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.curate import caption, clip
from vidforge.data.embeddings import AESTHETIC, DROPPED, EmbeddingStore
from vidforge.data.manifest import read_jsonl
from vidforge.errors import UserInputError
from vidforge.profile import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from curation_fixtures import SETTINGS  # noqa: E402

CLIP_SETS = [
    "curation.decode_workers=0",
    "curation.transcode_workers=0",
    "curation.stitch=false",
    "curation.min_seconds=0.5",
]
CAPTION_SETS = [*SETTINGS, "curation.caption.motion.enabled=false", "curation.caption.decode_workers=0"]


@pytest.fixture(scope="module")
def caption_run(tmp_path_factory) -> Path:
    from make_sample_videos import catalogue, write_video

    root = tmp_path_factory.mktemp("caption_store")
    scenes = [dataclasses.replace(s, frames=20) for s in catalogue()["cuts"][:3]]
    for name in ("cuts", "cuts_twin"):  # the grain is seeded by the name
        write_video(root, name, scenes)
    clip.run(
        load_profile(None, CLIP_SETS), [str(root / "cuts.mp4"), str(root / "cuts_twin.mp4")], root / "clips"
    )
    caption.run(load_profile(None, CAPTION_SETS), root / "clips", root / "captioned")
    return root / "captioned"


def _twins(manifest: list[dict]) -> list[tuple[dict, dict]]:
    """The kept clips paired by scene: the same start frame in the two videos."""
    by_start: dict[int, list[dict]] = {}
    for r in manifest:
        if r["keep"]:
            by_start.setdefault(r["start_frame"], []).append(r)
    assert all(len(pair) == 2 for pair in by_start.values()), by_start
    return [tuple(pair) for pair in by_start.values()]


def test_dedup_keep_aesthetic_on_a_caption_output(caption_run, tmp_path) -> None:
    manifest = read_jsonl(caption_run / "manifest.jsonl")
    twins = _twins(manifest)
    assert len(twins) == 3
    store = EmbeddingStore.open(caption_run)
    ids = store.ids().tolist()
    assert ids == [r["clip_id"] for r in manifest if r["keep"]]
    vectors = dict(zip(ids, store.vectors(), strict=True))
    # The clip run's vectors, carried: the same model's space as every clip run.
    source = EmbeddingStore.open(caption_run.parent / "clips")
    assert store.model == source.model
    assert all(np.array_equal(vectors[i], v) for i, v in zip(source.ids(), source.vectors(), strict=True))
    # A twin pair is closer than any two scenes: a threshold between them finds the pairs and only them.
    twin_sim = min(float(vectors[a["clip_id"]] @ vectors[b["clip_id"]]) for a, b in twins)
    other_sim = max(
        float(vectors[a["clip_id"]] @ vectors[c["clip_id"]])
        for a in manifest
        for c in manifest
        if a["keep"] and c["keep"] and a["start_frame"] != c["start_frame"]
    )
    assert other_sim < twin_sim
    threshold = f"{(twin_sim + other_sim) / 2:.9f}"
    # What each rule keeps, from the manifest: the higher aesthetic score, or the first in manifest order.
    order = {r["clip_id"]: i for i, r in enumerate(manifest)}
    by_score = {min(p, key=lambda r: r["aesthetic"])["clip_id"] for p in twins}
    by_order = {max(p, key=lambda r: order[r["clip_id"]])["clip_id"] for p in twins}
    # Clip ids hash the source's path, so manifest order (and whether the two rules differ: in about 7
    # runs of 8) depends on the temporary folder; each rule is checked against its own expectation.
    for keep, expected in (("aesthetic", by_score), ("first", by_order)):
        out = tmp_path / keep
        args = ["dedup", str(caption_run), "-o", str(out), "--threshold", threshold, "--keep", keep]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert {r["clip_id"] for r in read_jsonl(out / DROPPED)} == expected
    assert store.has_column(AESTHETIC)
    with pytest.raises(UserInputError, match="vidforge caption"):  # the clip run has no scores
        from vidforge.curate.embeddings.semdedup import load_corpus

        load_corpus([caption_run.parent / "clips"], keep="aesthetic")


def test_search_by_caption_text(caption_run) -> None:
    from vidforge.curate.embeddings.search import search

    manifest = [r for r in read_jsonl(caption_run / "manifest.jsonl") if r["keep"]]
    text = manifest[0]["caption"]
    same = {r["clip_id"] for r in manifest if r["caption"] == text}
    assert len(same) == 2
    store = EmbeddingStore.open(caption_run)
    assert store.text_model == {"name": "tiny-clip", "checkpoint": None}
    profile = load_profile(None, CAPTION_SETS)
    hits = search(profile, [caption_run], text=text, k=3, captions=True)
    assert {h.clip_id for h in hits[:2]} == same
    assert hits[0].score == pytest.approx(1.0, abs=1e-5) and hits[2].score < 0.99
    one, twin = sorted(same)
    assert search(profile, [caption_run], like=one, k=1, captions=True)[0].clip_id == twin
    result = CliRunner().invoke(
        app,
        [
            "search",
            str(caption_run),
            text,
            "--captions",
            "-k",
            "2",
            *(x for s in CAPTION_SETS for x in ("--set", s)),
        ],
    )
    assert result.exit_code == 0, result.output
    assert all(cid in result.output for cid in same)
    with pytest.raises(UserInputError, match="curation.caption.clip.model"):
        search(
            load_profile(None, ["curation.caption.clip.model=ViT-B-32"]),
            [caption_run],
            text=text,
            captions=True,
        )
    with pytest.raises(UserInputError, match="no caption text vectors"):
        search(profile, [caption_run.parent / "clips"], text=text, captions=True)
