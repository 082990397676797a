"""Curricula (`stages:`): each stage runs with its own fields and starts from the previous stage's EMA;
a curriculum killed inside stage 2 and resumed gives the losses of an uninterrupted one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import killed_at_forward, make_latents, train_profile  # noqa: E402

from vidforge.errors import UserInputError  # noqa: E402
from vidforge.profile import ProfileError, load_profile  # noqa: E402
from vidforge.train import curriculum  # noqa: E402
from vidforge.weights.checkpoint import load_model  # noqa: E402

# Stage "a": 3 steps at the profile's lr; stage "b": 4 steps at a tenth of it, its own data list, a
# checkpoint every 2 steps (train.save_every=2): killed in b's step 3, it resumes from b's step 2.
STAGES = "stages=[{name: a, steps: 3}, {name: b, steps: 4, lr: 0.0001, data: [{path: %s}]}]"


@pytest.fixture(scope="module")
def latents(tmp_path_factory) -> Path:
    return make_latents(tmp_path_factory.mktemp("data"))


def _profile(latents: Path):
    return train_profile(STAGES % latents, "train.save_every=2")


def _metrics(run_dir: Path) -> list[dict]:
    lines = []
    for folder in sorted((run_dir / "stages").iterdir()):
        lines += [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return lines


@pytest.fixture(scope="module")
def uninterrupted(latents, tmp_path_factory) -> tuple[Path, curriculum.CurriculumSummary]:
    run_dir = tmp_path_factory.mktemp("run")
    steps: list[int] = []
    summary = curriculum.run(_profile(latents), [latents], run_dir, on_step=steps.append)
    assert steps == list(range(1, 8))  # the bar counts over both stages
    return run_dir, summary


def test_stages_run_in_order_with_their_own_fields(uninterrupted) -> None:
    run_dir, summary = uninterrupted
    lines = _metrics(run_dir)
    assert [(r["stage"], r["step"]) for r in lines] == [("a", s) for s in (1, 2, 3)] + [
        ("b", s) for s in (1, 2, 3, 4)
    ]
    assert max(r["lr"] for r in lines if r["stage"] == "b") <= 1e-4 < lines[1]["lr"]
    b = load_profile(run_dir / "stages" / "02-b" / "profile.yaml")
    assert (b.train.steps, b.train.lr, b.stages) == (4, 1e-4, [])
    assert [s["stage"] for s in summary.stages] == ["a", "b"]
    state = json.loads(
        (run_dir / "stages" / "02-b" / "checkpoints" / "step_00000004" / "rank00000.json").read_text()
    )
    assert state["stage"] == "b" and state["step"] == 4
    # infer -c RUN finds the last stage's export
    assert (run_dir / "export").resolve() == (run_dir / "stages" / "02-b" / "export").resolve()


def test_stage_two_starts_from_stage_ones_ema(uninterrupted, latents, tmp_path) -> None:
    """Stage b's first weights are stage a's export (its EMA): b's step-1 loss, recomputed from a plain
    --init of a's export, is the same float."""
    from vidforge.profile.checks import apply_stage
    from vidforge.train import loop
    from vidforge.train.init_weights import WeightsInit

    run_dir, _ = uninterrupted
    profile = _profile(latents)
    stage_b = apply_stage(profile, profile.stages[1])
    again = loop.run(
        stage_b.model_copy(update={"train": stage_b.train.model_copy(update={"steps": 1})}),
        [latents],
        tmp_path,
        init=WeightsInit(run_dir / "stages" / "01-a" / "export"),
    )
    first_b = next(r for r in _metrics(run_dir) if r["stage"] == "b")
    assert again.final_loss_mean == first_b["loss"]
    a = dict(load_model(run_dir / "stages" / "01-a" / "export").named_parameters())
    b = dict(load_model(run_dir / "export").named_parameters())
    assert not torch.equal(a["patch_embed.weight"], b["patch_embed.weight"])  # and b trained on from there


def test_killed_in_stage_two_and_resumed_gives_the_uninterrupted_losses(
    uninterrupted, latents, tmp_path, monkeypatch
) -> None:
    with killed_at_forward(monkeypatch, 6):  # a's 3 steps, b's 2, then the kill in b's step 3
        curriculum.run(_profile(latents), [latents], tmp_path)
    assert (tmp_path / "stages" / "01-a" / curriculum.DONE).is_file()
    assert not (tmp_path / "stages" / "02-b" / curriculum.DONE).exists()
    with pytest.raises(UserInputError, match="pass --resume"):
        curriculum.run(_profile(latents), [latents], tmp_path)
    summary = curriculum.run(_profile(latents), [latents], tmp_path, resume=True)
    a, b = summary.stages
    assert a["skipped"] and not b["skipped"] and (b["start_step"], b["last_step"]) == (2, 4)
    want = [(r["stage"], r["step"], r["loss"]) for r in _metrics(uninterrupted[0])]
    assert [(r["stage"], r["step"], r["loss"]) for r in _metrics(tmp_path)] == want  # bitwise


def test_each_stage_is_held_to_the_profile_checks() -> None:
    with pytest.raises(ProfileError, match=r"in stage 'v', data.frame_buckets: each must be 4k\+1"):
        train_profile(
            "stages=[{name: i, steps: 3, frame_buckets: [1]}, {name: v, steps: 3, frame_buckets: [8]}]"
        )
    with pytest.raises(ProfileError, match=r"in stage 'i', train.warmup_steps: must be below train.steps=3"):
        train_profile("train.warmup_steps=5", "stages=[{name: i, steps: 3}]")
    with pytest.raises(ProfileError, match="each stage needs its own name; i repeats"):
        train_profile("stages=[{name: i, steps: 3}, {name: i, steps: 4}]")


def test_train_help_names_stages_and_data_is_needed_only_for_stages_without_it(tmp_path) -> None:
    from typer.testing import CliRunner

    from vidforge.cli.app import app

    result = CliRunner().invoke(app, ["train", "--help"])
    text = " ".join(result.stdout.split())  # the help is wrapped to the terminal's width
    assert result.exit_code == 0 and "`stages:` (a curriculum)" in text and "previous stage's EMA" in text
    no_data = ["train", "--run-dir", str(tmp_path), "--set", "stages=[{name: a, steps: 200}]"]
    result = CliRunner().invoke(app, no_data)
    assert result.exit_code == 2 and "train needs --data LATENTS" in result.stderr
