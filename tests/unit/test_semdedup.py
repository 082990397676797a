"""`vidforge dedup` (curate/embeddings/semdedup.py) over embedding stores: the clustered search finds what all-pairs
finds (>= 99% of the dropped clips, nothing it does not), gives the same files twice and after a run
stopped between clusters and on Ray (opt-in), and follows the keep rule; the store's text vectors, row
lookup and rewrite, and the caption stage's text log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.curate.embeddings import semdedup
from vidforge.data.embeddings import AESTHETIC, DROPPED, EmbeddingStore, Gathered, positions, write_store
from vidforge.data.manifest import read_jsonl
from vidforge.errors import UserInputError
from vidforge.profile import load_profile

MODEL = {"name": "synthetic", "checkpoint": None}
# Small clusters, so a few thousand clips make dozens of clusters and many boundaries.
SETS = ["curation.semantic_dedup.cluster_size=200", "curation.semantic_dedup.threshold=0.95"]


def planted(n: int, d: int, copies: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around a few topics (so k-means has structure to find) and `copies` noisy copies of
    random earlier rows at cosine about 0.95-0.99 (some just under the threshold). Returns (vectors,
    source row of each copy)."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((20, d))
    x = topics[rng.integers(0, 20, n - copies)] * 0.4 + rng.standard_normal((n - copies, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    src = rng.integers(0, n - copies, copies)
    noise = rng.standard_normal((copies, d)) * rng.uniform(0.1, 0.35, (copies, 1)) / np.sqrt(d)
    y = x[src] + noise
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return np.concatenate([x, y]).astype(np.float32), src


def two_runs(root: Path, n: int = 4000, d: int = 32) -> tuple[list[Path], np.ndarray]:
    vectors, _ = planted(n, d, n // 10, seed=1)
    order = np.random.default_rng(2).permutation(n)  # copies spread over both runs
    vectors = vectors[order]
    runs = []
    for i, rows in enumerate(np.array_split(np.arange(n), 2)):
        run = root / f"run{i}"
        ids = [f"c{r:05d}" for r in rows]
        write_store(run, ids, vectors[rows], MODEL, {"duration_s": np.ones(len(rows))}, shard_rows=700)
        runs.append(run)
    return runs, vectors


def _dropped(out: Path) -> dict[str, tuple[str, float]]:
    return {r["clip_id"]: (r["duplicate_of"], r["similarity"]) for r in read_jsonl(out / DROPPED)}


def test_dedup_equals_exact_pairwise_on_synthetic_runs(tmp_path) -> None:
    runs, vectors = two_runs(tmp_path)
    result = CliRunner().invoke(
        app, ["dedup", *map(str, runs), "-o", str(tmp_path / "out"), *sum((["--set", s] for s in SETS), [])]
    )
    assert result.exit_code == 0, result.output
    got = _dropped(tmp_path / "out")
    corpus = semdedup.load_corpus(runs)  # the corpus's own ranks (int32), as the bench's recall passes them
    assert np.array_equal(corpus.rank, np.arange(len(vectors)))  # runs in order: row = rank
    exact = semdedup.exact_duplicates(vectors, corpus.rank, 0.95)
    want = {f"c{r:05d}": (f"c{d:05d}", s) for r, (d, s) in exact.items()}
    assert len(want) > 300  # most planted copies are over the threshold, some not
    assert set(got) <= set(want)  # nothing dropped that all-pairs keeps
    assert len(set(got) & set(want)) / len(want) >= 0.99
    same_partner = sum(got[c][0] == want[c][0] for c in got)
    assert same_partner / len(got) >= 0.99
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["clusters"] >= 15 and summary["dropped"] == len(got)


def test_same_output_twice_and_after_stopping_between_clusters(tmp_path) -> None:
    runs, _ = two_runs(tmp_path, n=1500)
    profile = load_profile(None, SETS)
    semdedup.run(profile, runs, tmp_path / "a")
    semdedup.run(profile, runs, tmp_path / "b")
    partial = semdedup.run(profile, runs, tmp_path / "c", stop_after=4)  # a run killed after 4 clusters
    assert partial["committed"] == 4 and not (tmp_path / "c" / DROPPED).exists()
    resumed = semdedup.run(profile, runs, tmp_path / "c")
    assert resumed["plan_reused"]
    a = (tmp_path / "a" / DROPPED).read_bytes()
    assert a == (tmp_path / "b" / DROPPED).read_bytes() == (tmp_path / "c" / DROPPED).read_bytes()
    assert a  # something was dropped
    # Other settings are another partition: the old units are not reused.
    other = semdedup.run(load_profile(None, [*SETS, "curation.semantic_dedup.seed=5"]), runs, tmp_path / "c")
    assert not other["plan_reused"]


def test_keep_rule_longest_and_first(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 16)).astype(np.float32)
    x[7] = x[3] + 0.01  # 7 duplicates 3; 7 is the longer clip
    durations = np.ones(50)
    durations[7] = 5.0
    write_store(tmp_path / "run", [f"c{i}" for i in range(50)], x, MODEL, {"duration_s": durations})
    for keep, dropped, kept in (("first", "c7", "c3"), ("longest", "c3", "c7")):
        profile = load_profile(None, [f"curation.semantic_dedup.keep={keep}"])
        semdedup.run(profile, [tmp_path / "run"], tmp_path / keep)
        assert _dropped(tmp_path / keep).keys() == {dropped}
        assert _dropped(tmp_path / keep)[dropped][0] == kept


def test_store_reads_back_what_was_written(tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32)
    write_store(tmp_path, [f"c{i}" for i in range(10)], x, MODEL, {"duration_s": np.arange(10)}, shard_rows=3)
    store = EmbeddingStore.open(tmp_path)
    assert store.rows == 10 and len(store.index["shards"]) == 4
    assert store.ids().tolist() == [f"c{i}" for i in range(10)]
    assert np.array_equal(store.vectors(), x)
    assert np.array_equal(store.column("duration_s"), np.arange(10, dtype=np.float32))
    _, first = next(store.shards())
    assert isinstance(first, np.memmap)


@pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_RAY_DEDUP") != "1",
    reason="opt-in (VIDFORGE_TEST_RAY_DEDUP=1): a Ray instance starts in 20-60 s on a 2-core machine",
)
def test_ray_executor_gives_the_same_output(tmp_path) -> None:
    pytest.importorskip("ray")
    runs, _ = two_runs(tmp_path, n=1500)
    profile = load_profile(None, SETS)
    semdedup.run(profile, runs, tmp_path / "local")
    semdedup.run(profile, runs, tmp_path / "ray", executor="ray")
    assert (tmp_path / "ray" / DROPPED).read_bytes() == (tmp_path / "local" / DROPPED).read_bytes()


def test_keep_aesthetic_ranks_unmeasured_clips_last(tmp_path) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 16)).astype(np.float32)
    x[9] = x[2] + 0.01  # 9 duplicates 2, and scores higher
    x[12] = x[4] + 0.01  # 12 duplicates 4, which has no score
    scores = np.zeros(30, np.float32)
    scores[9], scores[4] = 1.0, np.nan
    write_store(tmp_path / "run", [f"c{i}" for i in range(30)], x, MODEL, {AESTHETIC: scores})
    profile = load_profile(None, ["curation.semantic_dedup.keep=aesthetic"])
    semdedup.run(profile, [tmp_path / "run"], tmp_path / "out")
    assert {k: v[0] for k, v in _dropped(tmp_path / "out").items()} == {"c2": "c9", "c4": "c12"}


def test_store_text_vectors_row_lookup_and_a_smaller_rewrite(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((10, 8)).astype(np.float32), rng.standard_normal((10, 4)).astype(np.float32)
    ids = [f"c{i}" for i in range(10)]
    write_store(tmp_path, ids, x, MODEL, shard_rows=3, text=t, text_model={"name": "m", "checkpoint": None})
    store = EmbeddingStore.open(tmp_path)
    assert store.text_model == {"name": "m", "checkpoint": None}
    assert np.array_equal(np.concatenate([v for _, v in store.shards("text")]), t)
    at = positions(store.ids(), ["c7", "c0", "c7-longer-than-any-id", "nope"])
    assert at.tolist() == [7, 0, -1, -1]
    assert np.array_equal(Gathered(store.row_source(), at, 8)[:], np.stack([x[7], x[0], 0 * x[0], 0 * x[0]]))
    assert positions(np.array(["a", "b", "a"]), ["a"]).tolist() == [2]  # the last written wins
    write_store(tmp_path, ids[:4], x[:4], MODEL, shard_rows=3)  # 2 shards where there were 4
    assert sorted(p.name for p in (tmp_path / "embeddings").glob("*.ids.npy")) == [
        "part-000000.ids.npy",
        "part-000001.ids.npy",
    ]
    store = EmbeddingStore.open(tmp_path)
    assert store.rows == 4 and store.text_model is None
    with pytest.raises(UserInputError, match="no caption text vectors"):
        next(store.shards("text"))


def test_text_log_reads_only_rows_with_their_id(tmp_path) -> None:
    from vidforge.curate.captioning.store import TextLog, _pending

    v = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    log = TextLog(tmp_path)
    for i in range(3):
        log.append(f"c{i}", v[i])
    log.append("none", None)
    log.close()
    rows = next((tmp_path / "embeddings" / "pending").glob("*.f32"))
    with open(rows, "ab") as f:
        f.write(v[3].tobytes()[:10])  # a killed run's last row: part of it, no id line
    later = TextLog(tmp_path)
    later.append("c1", v[3])  # redone by a later run: its vector wins
    later.close()
    ids, source, dim = _pending(tmp_path)
    assert dim == 6 and ids.tolist() == ["c0", "c1", "c2", "c1"]
    got = source.take(positions(ids, ["c0", "c1", "c2"]), dim)
    assert np.array_equal(got, v[[0, 3, 2]])


def test_a_cluster_compared_in_small_blocks_finds_the_same_pairs() -> None:
    """A big cluster is compared a few rows at a time (its temporaries bounded, `_PAIR_BLOCK`): the pairs
    found do not depend on the block, across the member/prober boundary too."""
    vectors, _ = planted(3000, 32, 600, seed=3)
    rows = np.arange(len(vectors))
    ranks = np.random.default_rng(0).permutation(len(vectors))
    work = semdedup.ClusterWork(0, rows, 1700, vectors, ranks)  # 1700 members, then 1300 probers
    whole = semdedup.cluster_pairs(work, 0.95, chunk=4096)
    assert len(whole) > 100
    for chunk in (64, 1000):
        assert sorted(semdedup.cluster_pairs(work, 0.95, chunk=chunk)) == sorted(whole)


@pytest.mark.parametrize("sort_chunk", [None, 97])
def test_groups_list_each_clusters_members_then_probers_by_row(monkeypatch, sort_chunk) -> None:
    """The cluster grouping (two sorted int32 row arrays, 16 bytes a clip at 4 probes) against a direct
    listing: cluster ids with gaps, a probed cluster that has no members (skipped), rows that are not
    finite (-1 everywhere) and rows with fewer candidates than probes (-1 padding); sorted at once and a
    few rows at a time (`_SORT_CHUNK`, chunks ending mid-row)."""
    if sort_chunk is not None:
        monkeypatch.setattr(semdedup, "_SORT_CHUNK", sort_chunk)
    rng = np.random.default_rng(0)
    n, p = 3000, 4
    probes = np.stack([rng.choice(np.arange(0, 400, 3), p, replace=False) for _ in range(n)]).astype(np.int32)
    probes[probes == 9] = 10  # a cluster id only probers name, never a member's
    probes[probes[:, 0] == 10, 0] = 12
    probes[rng.random(n) < 0.05] = -1
    probes[rng.random(n) < 0.05, 2:] = -1
    groups = semdedup._groups(probes)
    expected = {}
    for c in sorted(set(probes[:, 0].tolist()) - {-1}):
        members = [r for r in range(n) if probes[r, 0] == c]
        probers = [r for r in range(n) if c in probes[r, 1:].tolist()]
        expected[c] = (members + probers, len(members))
    got = {int(c): (groups.rows(i).tolist(), int(groups.members[i])) for i, c in enumerate(groups.clusters)}
    assert got == expected
    assert 10 not in got and any(10 in row for row in probes[:, 1:].tolist())
    assert groups.sizes.tolist() == [len(v[0]) for v in expected.values()]


def test_groups_hold_int32_rows_and_chunk_sized_temporaries(monkeypatch) -> None:
    """The grouping's numpy peak (tracemalloc) at 200K clips x 4 probes is its int32 row lists, 16 bytes a
    clip, plus temporaries of one sort chunk: not a stable argsort's int64 order of N x probes (the sort
    before this held ~100 bytes a clip, 2.5x the 10M partition's probes)."""
    import tracemalloc

    monkeypatch.setattr(semdedup, "_SORT_CHUNK", 1 << 14)
    rng = np.random.default_rng(0)
    n, p = 200_000, 4
    probes = rng.integers(0, 200, (n, p)).astype(np.int32)
    tracemalloc.start()
    try:
        groups = semdedup._groups(probes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    kept = groups.member_rows.nbytes + groups.prober_rows.nbytes
    assert kept == 16 * n
    assert peak < kept + (2 << 20), (peak, kept)  # one chunk's temporaries: ~70 bytes x 16K entries


def test_nearest_centroids_do_not_depend_on_the_block(monkeypatch) -> None:
    """Clips are matched against many centroids a bounded block of rows at a time (`_SIMS_BLOCK`: at 10M
    clips a cell's clips meet ~10K fine centroids): the nearest found are those of one matmul."""
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(3000, 64, generator=gen), dim=1)
    centroids = torch.nn.functional.normalize(torch.randn(500, 64, generator=gen), dim=1)
    whole = (x @ centroids.T).topk(4, dim=1).indices
    monkeypatch.setattr(semdedup, "_SIMS_BLOCK", 500 * 100)  # 100 rows a block
    assert torch.equal(semdedup._nearest(x, centroids, 4), whole)


def test_probes_are_each_clips_nearest_fine_centroids_read_in_one_pass_in_row_order(
    tmp_path, monkeypatch
) -> None:
    """The partition's probes, against a direct computation from the k-means' own centroids: each clip's
    `probes` most similar fine centroids among those of the coarse cells its cell's clips reach. Beyond
    the k-means samples, the stores are read in row order only (scattered gathers of whole cells were
    ~1 TB of read-ahead at 10M clips)."""
    import torch

    runs, vectors = two_runs(tmp_path, n=3000, d=32)
    cfg = load_profile(None, SETS).curation.semantic_dedup
    fitted = []
    kmeans = semdedup.spherical_kmeans
    monkeypatch.setattr(semdedup, "spherical_kmeans", lambda *a: fitted.append(kmeans(*a)) or fitted[-1])
    gathered = []
    exact = semdedup.Corpus.exact
    monkeypatch.setattr(
        semdedup.Corpus, "exact", lambda self, rows: gathered.append(len(rows)) or exact(self, rows)
    )
    corpus = semdedup.load_corpus(runs)
    probes = semdedup.partition(corpus, cfg)

    x = torch.from_numpy(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    coarse, fine = fitted[0], fitted[1:]
    near = (x @ coarse.T).topk(cfg.coarse_probes, dim=1).indices
    cell = near[:, 0]
    cells_with_clips = sorted(set(cell.tolist()))  # each fitted its fine centroids, in cell order
    cell_of_fine = torch.cat([torch.full((len(f),), c) for c, f in zip(cells_with_clips, fine, strict=True)])
    centroids = torch.cat(fine)
    for c in cells_with_clips:
        rows = torch.nonzero(cell == c).flatten()
        allowed = torch.nonzero(torch.isin(cell_of_fine, torch.unique(near[rows]))).flatten()
        expected = allowed[(x[rows] @ centroids[allowed].T).topk(cfg.probes, dim=1).indices]
        assert np.array_equal(probes[rows.numpy()], expected.numpy()), c
    assert sum(gathered) <= cfg.sample_per_cluster * (len(coarse) + len(centroids))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_rows_reads_what_indexing_the_array_gives(tmp_path, dtype) -> None:
    """`gather_rows` (the dedup's scattered reads, by position with read-ahead off) against numpy's own
    indexing of the loaded array: rows in any order, repeated, in runs and alone."""
    from vidforge.data.embeddings import gather_rows

    array = np.random.default_rng(0).standard_normal((5000, 24)).astype(dtype)
    path = tmp_path / "part.vectors.npy"
    np.save(path, array)
    rng = np.random.default_rng(1)
    rows = np.concatenate([rng.integers(0, 5000, 3000), np.arange(100, 160), [4999, 0, 0, 7]])
    rng.shuffle(rows)
    assert np.array_equal(gather_rows(path, rows), array[rows])
    assert gather_rows(path, np.zeros(0, np.int64)).shape == (0, 24)
    with pytest.raises(IndexError):
        gather_rows(path, np.array([5000]))


def test_corpus_gathers_with_the_headers_read_when_the_stores_opened(tmp_path, monkeypatch) -> None:
    """The dedup gathers from a shard ~1.5M times at 10M clips: `Corpus.exact` reads with the headers
    `EmbeddingStore.open` read once (no header parsed per gather), and gives the rows numpy's indexing of
    the mapped shards gives, across shards and runs."""
    from vidforge.data import embeddings

    runs, vectors = two_runs(tmp_path, n=3000, d=32)
    corpus = semdedup.load_corpus(runs)
    parsed = []
    header = embeddings.npy_header
    monkeypatch.setattr(embeddings, "npy_header", lambda path: parsed.append(path) or header(path))
    rows = np.random.default_rng(3).integers(0, len(corpus), 500)
    got = corpus.exact(rows)
    assert parsed == []
    stored = np.concatenate([np.load(f, mmap_mode="r") for f in corpus.files])
    assert np.array_equal(got, semdedup._unit_rows(stored[rows].astype(np.float32)))
    assert np.allclose(got, vectors[rows] / np.linalg.norm(vectors[rows], axis=1, keepdims=True), atol=1e-6)
    # a header handed in is the one the file holds: the same rows as reading it from the path
    path = corpus.files[1]
    assert np.array_equal(
        embeddings.gather_rows(path, rows[:50] % 700, corpus.headers[1]),
        np.load(path, mmap_mode="r")[rows[:50] % 700],
    )
