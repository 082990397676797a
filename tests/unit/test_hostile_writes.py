"""Hostile inputs, round three (issue 46, items 1-3 and 14's caption files): every output file of every
command goes through the one writer (`vidforge.files`), so a symbolic link planted at a final name, at a
temporary's predictable name, or as the output folder itself never carries a write outside the folder;
input caption files go through the one reader, so a link out of the input folder never becomes data and
a file that is not UTF-8 is one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from diffusers import WanTransformer3DModel
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.errors import UserInputError
from vidforge.finetune import gather_captions, write_captions
from vidforge.models import build_model
from vidforge.profile import load_profile
from vidforge.train.export import export_weights

runner = CliRunner()
TINY = {
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 16,
    "ffn_dim": 40,
    "num_layers": 2,
}
SECRET = b"the user's own file, outside the output folder\n"


def _outside(tmp_path: Path, name: str) -> Path:
    target = tmp_path / "outside" / name
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(SECRET)
    return target


def _plant(folder: Path, names: list[str], tmp_path: Path) -> list[Path]:
    """A link at each name in `folder` (final names, the issue's temporary names and the writer's own
    predictable ones, this process's pid: CliRunner runs in it) to a file of its own outside."""
    folder.mkdir(parents=True, exist_ok=True)
    targets = []
    for i, name in enumerate(names):
        target = _outside(tmp_path, f"{i}-{name.strip('.')}")
        (folder / name).symlink_to(target)
        targets.append(target)
    return targets


def _temporaries(*finals: str) -> list[str]:
    """The writer's temporary names for `finals` (`.STEM.tmp-PID.SUFFIX`): predictable, so planted too."""
    return [f".{Path(n).stem}.tmp-{os.getpid()}{Path(n).suffix}" for n in finals]


def _untouched(targets: list[Path]) -> None:
    for target in targets:
        assert target.read_bytes() == SECRET, f"{target} was written through a planted link"


def _error(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wan") / "transformer"
    WanTransformer3DModel(**TINY).save_pretrained(folder)
    return folder


def test_model_import_and_export_write_nothing_through_planted_links(published, tmp_path):
    out = tmp_path / "imported"
    finals = ["profile.yaml", "config.json", "model.safetensors"]
    targets = _plant(
        out, [*finals, ".config.json.tmp", ".model.safetensors.tmp", *_temporaries(*finals)], tmp_path
    )
    result = runner.invoke(app, ["model", "import", str(published), "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    _untouched(targets)
    assert all((out / name).is_file() and not (out / name).is_symlink() for name in finals)
    assert load_profile(out / "profile.yaml").model.family == "wan"

    exported = tmp_path / "exported"
    finals = ["config.json", "diffusion_pytorch_model.safetensors"]
    planted = [
        *finals,
        ".config.json.tmp",
        ".diffusion_pytorch_model.safetensors.tmp",
        *_temporaries(*finals),
    ]
    targets = _plant(exported, planted, tmp_path)
    result = runner.invoke(app, ["model", "export", str(out), "-o", str(exported)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    _untouched(targets)
    assert WanTransformer3DModel.from_pretrained(exported) is not None


def test_an_output_folder_that_is_a_link_is_refused_before_anything_is_written(published, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").symlink_to(elsewhere)
    message = _error("model", "import", str(published), "-o", str(tmp_path / "out"))
    assert (
        message
        == f"error: {tmp_path / 'out'} is a symbolic link (a stage keeps to its own folders); remove it and run again"
    )
    assert list(elsewhere.iterdir()) == []


def _tiny_model():
    profile = load_profile("local_cpu", ["model.hidden=32", "model.mlp_hidden=64", "model.layers=1"])
    return profile, build_model(profile.model, device="cpu")


def test_train_export_keeps_to_the_run(tmp_path):
    """`train` writes its export with `export_weights` into RUN/export."""
    profile, model = _tiny_model()
    run = tmp_path / "run"
    finals = ["config.json", "model.safetensors", "profile.yaml"]
    targets = _plant(run / "export", [*finals, ".config.json.tmp", *_temporaries(*finals)], tmp_path)
    export_weights(profile, model, None, run / "export", step=1)
    _untouched(targets)
    assert all(
        (run / "export" / name).is_file() and not (run / "export" / name).is_symlink() for name in finals
    )

    other = tmp_path / "other_run"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other.mkdir()
    (other / "export").symlink_to(elsewhere)
    with pytest.raises(UserInputError, match="export is a symbolic link"):
        export_weights(profile, model, None, other / "export", step=1)
    assert list(elsewhere.iterdir()) == []


def test_finetune_captions_csv_is_not_written_through_a_planted_link(tmp_path):
    run = tmp_path / "run"
    targets = _plant(run, ["captions.csv.tmp", *_temporaries("captions.csv")], tmp_path)
    write_captions([(tmp_path / "a.mp4", "a red ball")], run / "captions.csv")
    _untouched(targets)
    assert (run / "captions.csv").read_text().splitlines()[1].endswith("a red ball")


def _videos(tmp_path: Path) -> Path:
    videos = tmp_path / "videos"
    videos.mkdir()
    for name in ("a", "b"):
        (videos / f"{name}.mp4").write_bytes(b"not decoded here")
    (videos / "a.txt").write_text("a red ball rolls")
    return videos


def test_a_caption_txt_linking_out_of_the_videos_folder_is_refused(tmp_path):
    videos = _videos(tmp_path)
    (videos / "b.txt").symlink_to(_outside(tmp_path, "secret.txt"))
    with pytest.raises(UserInputError, match=r"b\.txt: its caption is a symbolic link out of"):
        gather_captions(videos, [".mp4"])
    (videos / "b.txt").unlink()
    (videos / "b.txt").symlink_to(videos / "a.txt")  # a link inside the folder is the user's own
    assert [text for _, text in gather_captions(videos, [".mp4"])] == ["a red ball rolls"] * 2


def test_a_caption_txt_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    videos = _videos(tmp_path)
    (videos / "b.txt").write_bytes("une balle rouge, bien sûr".encode("latin-1"))
    with pytest.raises(UserInputError, match=rf"^{videos / 'b.txt'}: its caption is not UTF-8"):
        gather_captions(videos, [".mp4"])


def test_the_one_writer_refuses_a_temporary_planted_again(tmp_path, monkeypatch):
    """Between the unlink and the O_EXCL open another link appears: refused, not followed."""
    from vidforge import files

    target = tmp_path / "x.json"
    secret = _outside(tmp_path, "s")
    real_unlink = Path.unlink

    def unlink_then_plant(self, missing_ok=False):
        real_unlink(self, missing_ok=missing_ok)
        if files.TMP_MARK in self.name and not self.exists():
            os.symlink(secret, self)

    monkeypatch.setattr(Path, "unlink", unlink_then_plant)
    with pytest.raises(UserInputError, match="recreated while it was being written"):
        files.write_text(target, "{}")
    monkeypatch.undo()
    _untouched([secret])


def _copy(published: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(published, tmp_path / "transformer"))


def test_a_config_claiming_more_layers_than_its_weights_is_refused_before_the_model_is_built(
    published, tmp_path, monkeypatch
):
    import json
    import time

    from vidforge.families.wan import weights as wan_weights
    from vidforge.models import presets
    from vidforge.weights import checkpoint, weights_check

    src = _copy(published, tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_layers": 20000}))
    built: list[int] = []
    real = presets.build_model
    for module in (checkpoint, wan_weights, weights_check):  # every model the check or the reader builds
        monkeypatch.setattr(
            module, "build_model", lambda cfg, **kw: built.append(cfg.layers) or real(cfg, **kw)
        )
    start = time.monotonic()
    message = _error("model", "import", str(src), "-o", str(tmp_path / "out"))
    assert message == (
        f"error: {src / 'config.json'}: the config says 20000 layers, the weights hold 2 (blocks.0 .. blocks.1); "
        "the config and the weights come from different models"
    )
    assert time.monotonic() - start < 10 and built and max(built) <= 2  # was still building after 25 s

    # a vidforge export held to its weights the same way when it is loaded
    (src / "config.json").write_text(json.dumps(config))
    assert runner.invoke(app, ["model", "import", str(src), "-o", str(tmp_path / "out")]).exit_code == 0
    from vidforge.weights.checkpoint import load_model

    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    exported["model"]["layers"] = 20000
    (tmp_path / "out" / "config.json").write_text(json.dumps(exported))
    with pytest.raises(UserInputError, match="the config says 20000 layers, the weights hold 2"):
        load_model(tmp_path / "out")
    assert max(built) <= 2


@pytest.mark.parametrize("keep", [5, 200, -100])
def test_a_truncated_safetensors_file_is_one_line_naming_it(published, tmp_path, keep):
    src = _copy(published, tmp_path)
    weights = src / "diffusion_pytorch_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep])
    message = _error("model", "import", str(src), "-o", str(tmp_path / "out"))
    assert message.startswith(f"error: {weights}: ") and "download it again" in message
    what = "not a safetensors file" if 0 <= keep < 8 else "truncated: its"
    assert what in message


def test_train_refuses_a_linked_export_folder_before_its_first_step(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from train_fixtures import synthetic_latents, train_profile

    from vidforge.train import loop
    from vidforge.train.step import LocalTrainStep

    data = synthetic_latents(tmp_path)
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "export").symlink_to(elsewhere)
    steps: list[int] = []
    monkeypatch.setattr(LocalTrainStep, "forward", lambda *a, **k: steps.append(1))
    with pytest.raises(UserInputError, match=rf"^{run / 'export'} is a symbolic link"):
        loop.run(train_profile("train.steps=1"), [data], run)
    assert steps == [] and list(elsewhere.iterdir()) == []
