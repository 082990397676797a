"""`vidforge dedup` and `vidforge search` over a real `vidforge clip` run of the sample videos and a second
run built through the same store API (running `clip` twice would double the cost): the copies planted in
the second run are dropped and nothing else, `shard --dedup` leaves them out, `search` finds a clip by
its caption through the embedding model's own text tower, and by example."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.curate import clip
from vidforge.curate.embeddings.embedder import ImageEmbedder
from vidforge.curate.embeddings.search import search
from vidforge.data.embeddings import DROPPED, EmbeddingStore, write_store
from vidforge.data.manifest import read_jsonl
from vidforge.profile import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from curation_fixtures import make_clips_dir  # noqa: E402

CLIP_SETS = ["curation.decode_workers=0", "curation.transcode_workers=0", "curation.stitch=false"]
CAPTION = "a red ball rolls left across a green field"


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory, sample_videos) -> Path:
    out = tmp_path_factory.mktemp("dedup") / "run1"
    videos = [str(sample_videos / f"{n}.mp4") for n in ("false_split",)]
    clip.run(load_profile(None, CLIP_SETS), videos, out)
    return out


def _second_run(root: Path, first: Path, planted: list[int]) -> tuple[Path, dict[str, str]]:
    """Copies of `planted` rows of the first run (a re-ingested video: the same vector, a float's noise
    off), 40 unrelated clips and one clip whose vector is the text tower's for CAPTION."""
    store = EmbeddingStore.open(first)
    ids, vectors = store.ids(), store.vectors()
    rng = np.random.default_rng(0)
    copies = vectors[planted] + rng.standard_normal((len(planted), vectors.shape[1])) * 1e-4
    others = rng.standard_normal((40, vectors.shape[1]))
    others /= np.linalg.norm(others, axis=1, keepdims=True)
    caption = ImageEmbedder.from_profile(load_profile(None)).embed_text([CAPTION])
    new_ids = [f"copy-{ids[i]}" for i in planted] + [f"other-{i}" for i in range(40)] + ["captioned"]
    run = root / "run2"
    write_store(
        run,
        new_ids,
        np.concatenate([copies, others, caption]).astype(np.float32),
        store.model,
        {"duration_s": np.ones(len(new_ids))},
    )
    return run, {f"copy-{ids[i]}": str(ids[i]) for i in planted}


def test_dedup_across_runs_drops_the_planted_copies_and_nothing_else(clip_run, tmp_path) -> None:
    store = EmbeddingStore.open(clip_run)
    vectors = store.vectors()
    assert store.rows >= 3 and np.allclose(vectors, np.load(clip_run / "embeddings.npy"))
    assert store.ids().tolist() == [r["clip_id"] for r in read_jsonl(clip_run / "manifest.jsonl")]
    # Random-weight embeddings of different shots are close: the threshold sits above the closest real
    # pair, measured here, so only a copy can pass it.
    sims = vectors @ vectors.T
    closest = float(np.max(sims - 2 * np.eye(len(sims))))
    threshold = (closest + 1) / 2
    assert threshold < 1 - 1e-6
    run2, planted = _second_run(tmp_path, clip_run, [0, 2])
    out = tmp_path / "dedup"
    result = CliRunner().invoke(
        app, ["dedup", str(clip_run), str(run2), "-o", str(out), "--threshold", f"{threshold:.9f}"]
    )
    assert result.exit_code == 0, result.output
    dropped = {r["clip_id"]: r for r in read_jsonl(out / DROPPED)}
    assert {k: r["duplicate_of"] for k, r in dropped.items()} == planted
    assert all(r["duplicate_run"] == str(clip_run) and r["run"] == str(run2) for r in dropped.values())


def test_shard_leaves_out_what_dedup_dropped(tmp_path, sample_videos, sample_truth) -> None:
    from vidforge.data.sharding import plan_shards

    clips = make_clips_dir(tmp_path / "clips", sample_videos, sample_truth)
    records = [r for r in read_jsonl(clips / "manifest.jsonl") if r["media"].startswith("clips/")][:5]
    profile = load_profile(None)
    all_keys = {s.key for sh in plan_shards(clips, profile, (4, 8))[0] for s in sh.samples}
    gone = {records[1]["clip_id"], records[3]["clip_id"]}
    kept = {s.key for sh in plan_shards(clips, profile, (4, 8), gone)[0] for s in sh.samples}
    assert gone <= all_keys and kept == all_keys - gone


def test_search_finds_a_clip_by_its_caption_and_by_example(clip_run, tmp_path) -> None:
    run2, planted = _second_run(tmp_path, clip_run, [1])
    profile = load_profile(None)
    hits = search(profile, [clip_run, run2], text=CAPTION, k=3)
    assert hits[0].clip_id == "captioned" and hits[0].score == pytest.approx(1.0, abs=1e-5)
    original = next(iter(planted.values()))
    like = search(profile, [clip_run, run2], like=original, k=3)
    assert like[0].clip_id == f"copy-{original}"  # itself excluded, its copy first
    result = CliRunner().invoke(
        app, ["search", str(clip_run), str(run2), CAPTION, "-k", "2", "--review", str(tmp_path / "page")]
    )
    assert result.exit_code == 0, result.output
    assert "captioned" in result.output and (tmp_path / "page" / "index.html").is_file()
    other = load_profile(None, ["curation.embed_model=ViT-B-32"])
    with pytest.raises(Exception, match="curation.embed_model"):
        search(other, [clip_run], text=CAPTION)
