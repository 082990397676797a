"""`vidforge dedup` over random-weight embeddings says so (issue 44 item 9: 13 of 15 clips dropped without
a word that the embedder had no weights), through `Output.note_random_weights`, the one way every stage says
it; a store embedded with a checkpoint gets no note."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.embeddings import write_store


def _dedup(tmp_path, model: dict) -> str:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((15, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    run = tmp_path / model["name"].replace(":", "_")
    write_store(run, [f"c{i}" for i in range(15)], vectors, model, {"duration_s": np.ones(15)})
    result = CliRunner().invoke(app, ["dedup", str(run), "-o", str(tmp_path / f"out_{run.name}")])
    assert result.exit_code == 0, result.output
    return result.stderr


def test_dedup_of_random_weight_embeddings_says_so(tmp_path) -> None:
    said = _dedup(tmp_path, {"name": "ViT-B-32", "checkpoint": None})
    assert "random weights in embeddings of" in said and "curation.embed_checkpoint" in said
    assert "random weights" not in _dedup(tmp_path, {"name": "ViT-B-32", "checkpoint": "/w/open_clip.bin"})
