"""A Wan folder whose path holds a space, `#`, `:` and both quote characters keeps that path through every
command that reads it (issue 47, point 2): paths once travelled inside as `section.field=value` strings read
back as YAML, so a folder named `wan #2` became `wan` (a YAML comment) in the imported profile's
tokenizer.path and text_encoder.path. Each command's profile is checked against the folder itself, and each
command vidforge prints is read back by a shell's rules (`shlex.split`) and compared with the arguments it
stands for. The tiny published-layout Wan pipeline (`wan_fixtures`), nothing trained."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from wan_fixtures import save_tiny_wan_pipeline  # noqa: E402

from vidforge import finetune  # noqa: E402
from vidforge.cli.app import app  # noqa: E402
from vidforge.data.media import write_video  # noqa: E402
from vidforge.data.testing import synthetic_frames  # noqa: E402
from vidforge.profile import load_profile  # noqa: E402

HOSTILE = 'wan #2: "it\'s"'  # a space, a YAML comment, a mapping's colon, both quotes


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The tiny Wan pipeline in a folder named HOSTILE (itself under another such folder)."""
    return save_tiny_wan_pipeline(tmp_path_factory.mktemp("paths") / HOSTILE / HOSTILE).resolve()


def _parts(folder: Path) -> dict[str, str]:
    """What a profile of `folder` must say of its parts: the folder's own paths, character for character."""
    return {
        "tokenizer.path": str(folder / "vae"),
        "text_encoder.path": str(folder / "text_encoder"),
        "text_encoder.tokenizer_path": str(folder / "tokenizer"),
    }


def _said(data: dict) -> dict[str, str]:
    return {
        "tokenizer.path": data["tokenizer"]["path"],
        "text_encoder.path": data["text_encoder"]["path"],
        "text_encoder.tokenizer_path": data["text_encoder"]["tokenizer_path"],
    }


def _invoke(*argv: str):
    result = CliRunner().invoke(app, list(argv))
    assert result.exit_code == 0, result.output[-3000:]
    return result


def test_model_import_keeps_the_folders_paths_and_prints_commands_a_shell_reads_back(base, tmp_path):
    out = tmp_path / HOSTILE / "imported"
    result = _invoke("--json", "model", "import", str(base), "-o", str(out))
    printed = json.loads(result.output.strip().splitlines()[-1])
    assert Path(printed["export"]) == out
    profile = yaml.safe_load((out / "profile.yaml").read_text())
    assert _said(profile) == _parts(base)
    assert shlex.split(printed["sample"]) == [
        "vidforge",
        "infer",
        "-c",
        str(out),
        "--prompt",
        "TEXT",
        "-o",
        "OUT",
    ]
    assert shlex.split(printed["fine-tune"])[:6] == [
        "vidforge", "train", "--init", str(out), "--profile", str(out / "profile.yaml"),
    ]  # fmt: skip


def _videos(folder: Path) -> Path:
    folder.mkdir(parents=True)
    write_video(folder / "clip0.mp4", synthetic_frames(9, 32, 32, 0), fps=16)
    (folder / "clip0.txt").write_text("a red square moving right")
    return folder


def test_finetune_dry_run_and_the_profile_it_writes_keep_the_base_path(base, tmp_path):
    videos, out = _videos(tmp_path / HOSTILE / "videos"), tmp_path / HOSTILE / "run"
    argv = ["--json", "finetune", str(videos), "--base", str(base), "-o", str(out), "--dry-run"]
    dry = json.loads(_invoke(*argv, "--set", "data.buckets=[[32,32]]").output.strip().splitlines()[-1])
    commands = {s["stage"]: shlex.split(s["command"]) for s in dry["stages"]}
    assert commands["clip"] == [
        "vidforge", "clip", str(out / "captions.csv"), "-o", str(out / "clips"), "--profile", str(out / "profile.yaml"),
    ]  # fmt: skip
    train = commands["train"]
    assert train[train.index("--init") + 1] == str(base) and train[train.index("--run-dir") + 1] == str(
        out / "train"
    )
    assert not out.exists()  # a dry run writes nothing

    class Stop(Exception):
        pass

    class StopAtFirstStage(finetune.Hooks):  # the profile is written before the first stage starts
        def stage(self, name: str, command: str, skipped: bool) -> None:
            raise Stop

    request = finetune.Request(videos, base, out, overrides=("data.buckets=[[32,32]]",))
    with pytest.raises(Stop):
        finetune.run(request, StopAtFirstStage())
    written = load_profile(out / "profile.yaml")
    assert _said(written.model_dump(mode="json")) == _parts(base)
    assert written.curation.caption.sidecar.path == str(out / "captions.csv")
    # the commands it prints when done: sampling the LoRA and merging it
    sample, merge, _ = finetune._next_commands(written, base, out, str(out / "train" / "export"), "a: 'b'")
    assert shlex.split(sample) == [
        "vidforge", "infer", "-c", str(base), "--lora", str(out), "--prompt", "a: 'b'",
        "-o", str(out / "samples"),
    ]  # fmt: skip
    assert shlex.split(merge)[3] == str(out)


def test_bench_plan_fit_writes_the_folders_paths_and_prints_commands_a_shell_reads_back(base, tmp_path):
    recipe = tmp_path / HOSTILE / "recipe #1.yaml"
    argv = ["bench", "plan", "--fit", "--model", str(base), "--clip", "17x32x32", "--gpus", "1"]
    result = _invoke(*argv, "--accelerator", "rtx4090", "--set", "train.lora={rank: 4}", "-o", str(recipe))
    assert _said(yaml.safe_load(recipe.read_text())) == _parts(base)
    lines = [shlex.split(line) for line in result.output.splitlines() if line.startswith("  vidforge ")]
    finetune_argv, train_argv = lines
    assert finetune_argv[:8] == [
        "vidforge", "finetune", "VIDEOS", "--base", str(base), "-o", f"runs/{recipe.stem}", "--profile",
    ]  # fmt: skip
    assert finetune_argv[8] == str(recipe)
    assert train_argv[train_argv.index("--init") + 1] == str(base)
    assert train_argv[train_argv.index("--profile") + 1] == str(recipe)
    # the recipe's --set lines read back to its own settings
    pasted = [line for line in result.output.splitlines() if line.startswith("  --set ")][0]
    sets = shlex.split(pasted)[1::2]
    assert sets and all("=" in s for s in sets)
    assert load_profile(recipe, sets).train.lora.rank == 4
