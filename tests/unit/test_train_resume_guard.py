"""`train --resume` refuses what it cannot continue (issue 38, points 4 and 10): a command whose model
settings differ from the run's is one line naming the field, exit 2, before anything loads (it was DCP's
60-78 line traceback, exit 1); a checkpoint from before runs recorded their settings is held to this
model tensor by tensor; a torn per-rank state file is one line naming it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS, synthetic_latents  # noqa: E402

from vidforge.cli.app import app  # noqa: E402

STEPS = ("train.steps=2", "train.save_every=2")


def _train(latents: Path, run_dir: Path, *extra: str):
    args = ["train", "--data", str(latents), "--run-dir", str(run_dir)]
    for s in (*TRAIN_SETS, *STEPS, *extra):
        args += ["--set", s]
    return CliRunner().invoke(app, args)


@pytest.fixture(scope="module")
def latents(tmp_path_factory) -> Path:
    return synthetic_latents(tmp_path_factory.mktemp("guard"))


@pytest.fixture(scope="module")
def finished(latents, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("guard_run") / "run"
    result = _train(latents, run_dir)
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture
def run(finished, tmp_path) -> Path:
    """A copy of the finished 2-step run, for a test to resume (or damage) on its own."""
    return Path(shutil.copytree(finished, tmp_path / "run"))


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_resuming_with_another_model_shape_is_one_line_naming_the_field(latents, run) -> None:
    before = (run / "profile.yaml").read_text()
    line = _one_error_line(_resume(latents, run, "model.hidden=96"))
    assert line == (
        "error: --resume: the run was trained with model.hidden=64, this command has model.hidden=96; "
        f"resume with the run's settings ({run / 'profile.yaml'} before this command) or pass a new --run-dir"
    )
    assert (run / "profile.yaml").read_text() == before  # refused before the run's record is rewritten
    # What may change on resume does not count: how attention is computed.
    assert _resume(latents, run, "model.attention=dense").exit_code == 0


def test_a_checkpoint_without_recorded_settings_is_held_to_the_model_tensor_by_tensor(latents, run) -> None:
    state = run / "checkpoints" / "step_00000002" / "rank00000.json"
    saved = json.loads(state.read_text())
    assert saved["run"]["model.hidden"] == 64
    state.write_text(json.dumps({k: v for k, v in saved.items() if k != "run"}))
    line = _one_error_line(_resume(latents, run, "model.hidden=96"))
    assert line.startswith(
        "error: --resume: patch_embed.weight is [64, 192] in checkpoint step 2, [96, 192] in this model; "
    ), line


def test_a_torn_rank_state_is_one_line_naming_the_file(latents, run) -> None:
    state = run / "checkpoints" / "step_00000002" / "rank00000.json"
    state.write_text(state.read_text()[:40])
    line = _one_error_line(_resume(latents, run))
    assert line.startswith(f"error: {state}: damaged ("), line


def _resume(latents: Path, run: Path, *extra: str):
    args = ["train", "--data", str(latents), "--run-dir", str(run), "--resume"]
    for s in (*TRAIN_SETS, "train.steps=4", "train.save_every=2", *extra):
        args += ["--set", s]
    return CliRunner().invoke(app, args)
