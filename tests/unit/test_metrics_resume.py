"""A torn last line in metrics.jsonl (a crash mid-write) does not stop `--resume` (issue 23, point 7): it is
dropped with a warning; a damaged line elsewhere is a user error naming the file and the line. The whole
`vidforge train --resume` past a torn line is in test_train_loop.py (it shares that module's latents)."""

from __future__ import annotations

import json
import logging

import pytest

from vidforge.errors import UserInputError
from vidforge.train.metrics import MetricsLog, read_metrics


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
