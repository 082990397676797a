"""A torn last line in metrics.jsonl (a crash mid-write) does not stop `--resume` (issue 23, point 7): it is
dropped with a warning; a damaged line elsewhere is a user error naming the file and the line."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.errors import UserInputError
from vidforge.train.metrics import MetricsLog, read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS, make_latents  # noqa: E402


def _lines(*records) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines({"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}) + '{"loss": 0.3, "st')
    with caplog.at_level(logging.WARNING, logger="vidforge.train.metrics"):
        MetricsLog(tmp_path, enabled=True, resume_step=1).close()
    assert path.read_text() == _lines({"step": 1, "loss": 0.5})
    assert f"{path}:3: dropped a torn last line" in caplog.text


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (_lines({"step": 1}) + "garbage\n" + _lines({"step": 3}), ":2: not a metrics record"),
        (_lines({"step": 1}) + '{"loss": 1}\n', ":2: not a metrics record (no integer step)"),
    ],
)
def test_other_damage_names_the_file_and_line(tmp_path, text, where):
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    with pytest.raises(UserInputError, match=f"^{path}{where}".replace("(", r"\(").replace(")", r"\)")):
        read_metrics(path)


def test_train_resumes_past_a_torn_metrics_line(tmp_path):
    latents = make_latents(tmp_path / "data", samples=2)
    run = tmp_path / "run"
    base = ["train", "--data", str(latents), "--run-dir", str(run)]
    for s in [*TRAIN_SETS, "train.save_every=2"]:
        base += ["--set", s]
    first = CliRunner().invoke(app, [*base, "--set", "train.steps=2"])
    assert first.exit_code == 0, first.output
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"grad_norm": 0.1, "lo')  # the killed step-3 write
    resumed = CliRunner().invoke(app, [*base, "--set", "train.steps=3", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
