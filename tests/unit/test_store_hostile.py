"""Embedding stores written by someone who wishes the reader harm (issue 46, items 4-6, 9, 13, 14, 17): a
store is held to its own index and its files to each other before anything is allocated, a non-finite
vector is left out with a word instead of poisoning the clustering, a dedup resume checks that its input
is the one it started from, and `search` prints ids from data as text, never as terminal commands."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from test_semdedup import MODEL, SETS, _dropped, planted
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.curate.embeddings import semdedup
from vidforge.data.embeddings import EMBEDDINGS_DIR, INDEX, EmbeddingStore, write_store
from vidforge.errors import UserInputError
from vidforge.profile import load_profile

SET_ARGS = sum((["--set", s] for s in SETS), [])


def _store(run: Path, n: int = 600, d: int = 16, shard_rows: int = 200) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    write_store(run, [f"c{i:05d}" for i in range(n)], x, MODEL, {"duration_s": np.ones(n)}, shard_rows)
    return x


def _index(run: Path) -> dict:
    return json.loads((run / EMBEDDINGS_DIR / INDEX).read_text())


def _put_index(run: Path, index: dict) -> None:
    (run / EMBEDDINGS_DIR / INDEX).write_text(json.dumps(index))


def _refused(run: Path, *names: str) -> str:
    """The one-line refusal of opening `run`'s store: a UserInputError naming each of `names`."""
    with pytest.raises(UserInputError) as err:
        EmbeddingStore.open(run)
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message
    return message


def test_one_nan_vector_is_left_out_with_a_word_not_poisoning_the_clusters(tmp_path) -> None:
    """Issue 46.5: one NaN vector among 4,000 made dedup drop 788 of 999 duplicates, silently."""
    vectors, _ = planted(4000, 32, 400, seed=1)
    ids = [f"c{r:05d}" for r in range(len(vectors))]
    vectors[1234] = np.nan
    write_store(tmp_path / "run", ids, vectors, MODEL, {"duration_s": np.ones(len(ids))}, shard_rows=700)
    result = CliRunner().invoke(app, ["dedup", str(tmp_path / "run"), "-o", str(tmp_path / "out"), *SET_ARGS])
    assert result.exit_code == 0, result.output
    assert "not finite" in result.output and "c01234" in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["not_finite"] == 1 and summary["not_finite_ids"] == ["c01234"]
    finite = np.isfinite(vectors).all(axis=1)
    rows = np.flatnonzero(finite)
    exact = semdedup.exact_duplicates(vectors[finite], np.arange(len(rows)), 0.95)
    want = {ids[rows[r]] for r in exact}
    got = set(_dropped(tmp_path / "out"))
    assert len(want) > 300 and "c01234" not in got
    assert got <= want and len(got) / len(want) >= 0.99


def test_a_resume_after_the_vectors_changed_is_a_new_dedup(tmp_path) -> None:
    """Issue 46.4: a rerun on the same -o after the store's vectors were rewritten (same ids, same
    index) reported the old result; the saved partition and clusters belong to a digest of the input."""
    vectors, _ = planted(1500, 32, 150, seed=1)
    ids = [f"c{r:05d}" for r in range(len(vectors))]
    run = tmp_path / "run"
    write_store(run, ids, vectors, MODEL, {"duration_s": np.ones(len(ids))}, shard_rows=500)
    profile = load_profile(None, SETS)
    first = semdedup.run(profile, [run], tmp_path / "out")
    assert first["dropped"] > 100
    fresh = np.random.default_rng(9).standard_normal(vectors.shape).astype(np.float32)  # no duplicates
    write_store(run, ids, fresh, MODEL, {"duration_s": np.ones(len(ids))}, shard_rows=500)
    assert _index(run)["shards"] == EmbeddingStore.open(run).index["shards"]
    again = semdedup.run(profile, [run], tmp_path / "out")
    assert not again["plan_reused"]
    assert again["dropped"] == semdedup.run(profile, [run], tmp_path / "fresh")["dropped"] == 0


def test_vectors_a_row_short_of_their_ids_are_refused_naming_the_file(tmp_path) -> None:
    """Issue 46.6: vectors one row short of the ids paired rows with the wrong ids, exit 0."""
    run = tmp_path / "run"
    x = _store(run)
    with open(run / EMBEDDINGS_DIR / "part-000001.vectors.npy", "wb") as f:
        np.save(f, x[200:399])
    _refused(run, "part-000001.vectors.npy", "200 row(s)")
    result = CliRunner().invoke(app, ["dedup", str(run), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "part-000001.vectors.npy" in result.output


def test_an_index_claiming_millions_of_rows_is_refused_before_any_allocation(tmp_path) -> None:
    """Issue 46.9: an index.json claiming 4M rows (600 stored) was 15 s, then an allocator failure."""
    run = tmp_path / "run"
    _store(run)
    index = _index(run)
    index["rows"] = 4_000_000
    _put_index(run, index)
    _refused(run, INDEX, "4000000", "600")
    index["shards"][0]["rows"] = 4_000_000 - 400  # rows that add up: the shard's files hold 200
    _put_index(run, index)
    started = time.perf_counter()
    _refused(run, "part-000000.ids.npy", "3999600")
    assert time.perf_counter() - started < 1.0
    # A header that claims rows its file does not hold is caught before numpy maps it.
    path = run / EMBEDDINGS_DIR / "part-000002.vectors.npy"
    path.write_bytes(path.read_bytes()[:-64])
    _store(tmp_path / "other")
    (tmp_path / "other" / EMBEDDINGS_DIR / "part-000002.vectors.npy").write_bytes(path.read_bytes())
    _refused(tmp_path / "other", "part-000002.vectors.npy", "bytes")


@pytest.mark.parametrize("name", ["../../outside/secret", "/etc/passwd", "sub/part", ".hidden", ""])
def test_shard_names_leaving_the_store_are_refused(tmp_path, name) -> None:
    """Issue 46.13: shard names such as ../../outside/secret or absolute paths were read."""
    outside = tmp_path / "outside"
    _store(outside / "x")  # a readable store's files at the target, so only the name can refuse it
    run = tmp_path / "run"
    _store(run)
    index = _index(run)
    index["shards"][0]["name"] = name
    _put_index(run, index)
    _refused(run, INDEX, "not a plain file name")


def test_a_shard_file_linking_outside_the_store_is_refused(tmp_path) -> None:
    run, other = tmp_path / "run", tmp_path / "other"
    _store(run)
    _store(other)
    target = run / EMBEDDINGS_DIR / "part-000001.vectors.npy"
    target.unlink()
    os.symlink(other / EMBEDDINGS_DIR / "part-000001.vectors.npy", target)
    _refused(run, "part-000001.vectors.npy", "links outside")


@pytest.mark.parametrize(
    "damage, names",
    [
        (lambda i: {k: v for k, v in i.items() if k != "shards"}, [INDEX, "`shards`"]),
        (lambda i: [i], [INDEX, "not a JSON object"]),
        (lambda i: i | {"dim": "512"}, [INDEX, "`dim`"]),
        (lambda i: i | {"shards": [{"name": "part-000000"}]}, [INDEX, "rows None"]),
        (lambda i: i | {"columns": ["duration_s", "gone"]}, ["part-000000.gone.npy", "missing"]),
    ],
)
def test_a_damaged_store_is_one_line_naming_the_file(tmp_path, damage, names) -> None:
    """Issue 46.14: damaged stores gave `KeyError: 'shards'`, `IndexError`, `could not broadcast`."""
    run = tmp_path / "run"
    _store(run)
    _put_index(run, damage(_index(run)))
    _refused(run, *names)


def test_a_store_index_that_is_not_json_and_an_ids_file_of_another_length(tmp_path) -> None:
    run = tmp_path / "run"
    _store(run)
    (run / EMBEDDINGS_DIR / INDEX).write_bytes(b"\xff{not json")
    _refused(run, INDEX, "not a JSON store index")
    _store(run)
    with open(run / EMBEDDINGS_DIR / "part-000002.ids.npy", "wb") as f:
        np.save(f, np.asarray([f"x{i}" for i in range(150)]))
    _refused(run, "part-000002.ids.npy")
    result = CliRunner().invoke(app, ["search", str(run), "--like", "c00001"])
    assert result.exit_code == 2 and "part-000002.ids.npy" in result.output


HOSTILE_IDS = ["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "[link=file:///etc/passwd]click[/link]", "a\u202eexe.txt"]


def test_search_prints_ids_from_data_as_text_not_terminal_commands(tmp_path) -> None:
    """Issue 46.17: a clip id holding ESC]0;...BEL retitled the terminal, ESC[2J cleared it."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal(16).astype(np.float32)
    x = base + 0.01 * rng.standard_normal((len(HOSTILE_IDS) + 1, 16)).astype(np.float32)
    write_store(tmp_path / "run", ["query", *HOSTILE_IDS], x, MODEL)
    result = CliRunner().invoke(
        app, ["search", str(tmp_path / "run"), "--like", "query", "-k", "10"], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 0, result.output
    assert not any(c in result.output for c in ("\x1b", "\x07", "\u202e")), repr(result.output)
    for shown in ("\\x1b]0;pwned\\x07", "\\x1b[2J", "[link=file:///etc/passwd]click", "a\\u202eexe.txt"):
        assert shown in result.output, result.output
