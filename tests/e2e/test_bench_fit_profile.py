"""`vidforge bench plan --fit -o FILE` (issue 44): the fastest recipe written as a profile that names the
model folder's text encoder and VAE and the clip as the training buckets; the printed finetune command,
resolved as `vidforge finetune` resolves it, trains that recipe (its knobs survive finetune's own LoRA
defaults, and finetune's memory check passes); the printed train command's profile dry-runs. A clip that
does not fit exits 2 naming the data settings that do; --gpus and --clip are bounded (issue 46 item 16)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from wan_fixtures import save_tiny_wan_pipeline  # noqa: E402

from vidforge.cli.app import app  # noqa: E402

# A card so small that the tiny Wan at 81x480x832 fits only with full recompute (and the fp8 base ties).
SMALL = "cluster.accelerator={name: small, memory_gib: 0.05}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_wan_pipeline(tmp_path_factory.mktemp("Wan2.1-T2V-tiny-Diffusers"))


def _fit(folder: Path, *extra: str):
    argv = ["bench", "plan", "--fit", "--model", str(folder), "--clip", "81x480x832", "--gpus", "1"]
    return CliRunner().invoke(app, [*argv, "--set", SMALL, "--set", "train.lora={rank: 4}", *extra])


def _command(output: str, word: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.strip().startswith(f"vidforge {word} "))
    return shlex.split(line)


def test_the_written_profile_runs_as_printed(folder, tmp_path) -> None:
    from vidforge.finetune import Request, base_profile, check_fits, stage_overrides
    from vidforge.profile import load_profile

    recipe = tmp_path / "recipe.yaml"
    result = _fit(folder, "-o", str(recipe))
    assert result.exit_code == 0, result.output
    written = load_profile(str(recipe))
    assert written.name == "recipe" and "dit1b_1xh200" not in result.output
    assert written.text_encoder.path == str(folder / "text_encoder")
    assert written.tokenizer.path == str(folder / "vae")
    assert (written.data.frame_buckets, written.data.buckets) == ([81], [(480, 832)])
    # auto: the least recompute per block that fits, resolved by train at the run's shape
    assert written.train.activation_checkpointing == "auto" and written.train.lora.fp8_base

    argv = _command(result.output, "finetune")
    assert argv[2:6] == ["VIDEOS", "--base", str(folder), "-o"] and argv[argv.index("--profile") + 1] == str(
        recipe
    )
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    request = Request(
        videos=tmp_path, base=folder, out=tmp_path / "run", profile=str(recipe), overrides=tuple(sets)
    )
    finetune = base_profile(folder, str(recipe), [*stage_overrides(request, tmp_path / "c.csv"), *sets])
    for section in ("parallel", "model", "data", "tokenizer", "text_encoder"):
        assert getattr(finetune, section) == getattr(written, section), section
    assert finetune.train.lora == written.train.lora
    assert finetune.train.activation_checkpointing == written.train.activation_checkpointing
    check_fits(finetune)  # finetune's own memory check agrees with the plan

    train = _command(result.output, "train")
    assert train[train.index("--init") + 1] == str(folder)
    dry = ["train", "--dry-run", "--init", str(folder), "--profile", str(recipe)]
    done = CliRunner().invoke(app, dry)
    assert done.exit_code == 0, done.output


def test_a_clip_that_does_not_fit_exits_2_in_the_datas_terms(folder, tmp_path) -> None:
    result = _fit(folder, "--set", "cluster.accelerator.memory_gib=0.01", "-o", str(tmp_path / "r.yaml"))
    assert result.exit_code == 2, result.output
    error = result.output.strip().splitlines()[-1]
    assert (
        "nothing fits the clip 81x480x832" in error
        and "--set 'data.frame_buckets=[33]' --set 'data.buckets=[[320, 576]]'" in error
    )
    assert "bench.latent" not in error and not (tmp_path / "r.yaml").exists()


def test_the_machine_and_clip_are_bounded_in_one_line() -> None:
    start = time.monotonic()
    for argv, says in (
        (["--gpus", "1073741824"], "one machine has at most 72"),
        (["--clip", "80x480x832"], "frames must be 4k+1"),
        (["--clip", "81x480x100000"], "multiples of 8 up to 4096"),
        (["--accelerator", "h100", "--set", "cluster.gpus_per_node=4096"], "at most 72"),
    ):
        result = CliRunner().invoke(app, ["bench", "plan", "--fit", "--model", "wan2.1-1.3b", *argv])
        assert result.exit_code == 2 and says in result.output, result.output
    rank = CliRunner().invoke(app, ["bench", "plan", "--rank", "--world-size", "1073741824"])
    assert rank.exit_code == 2
    assert time.monotonic() - start < 30
