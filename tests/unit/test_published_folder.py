"""A published folder as a new user meets it (a tiny random Wan2.1 pipeline as diffusers saves it):
`model import` writes the profile that trains and samples it as published, `train --init` reads its
config, a profile that contradicts its weights is refused in one line, and diffusers loads both the
folder and vidforge's export of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from wan_fixtures import FLOW_SHIFT, save_tiny_wan_pipeline

from vidforge.cli.app import app
from vidforge.profile import load_profile

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    return save_tiny_wan_pipeline(tmp_path_factory.mktemp("Wan2.1-T2V-tiny-Diffusers"))


@pytest.fixture(scope="module")
def imported(pipeline, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imported")
    result = CliRunner().invoke(app, ["model", "import", str(pipeline), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_import_names_the_commands_that_sample_and_fine_tune_it(pipeline, tmp_path) -> None:
    # `train --profile OUT/profile.yaml` alone would train that shape from scratch: the fine-tune needs --init.
    out = tmp_path / "imported"
    result = CliRunner().invoke(app, ["--json", "model", "import", str(pipeline), "-o", str(out)])
    assert result.exit_code == 0, result.output
    said = json.loads(result.output.strip().splitlines()[-1])
    assert said["sample"].startswith(f"vidforge infer -c {out}")
    assert f"vidforge train --init {out} --profile {out}/profile.yaml" in said["fine-tune"]


def test_the_imported_profile_trains_and_samples_the_model_as_published(pipeline, imported) -> None:
    profile = load_profile(imported / "profile.yaml")
    d, tok, text = profile.diffusion, profile.tokenizer, profile.text_encoder
    assert (d.objective, d.flow_prediction, d.flow_shift, d.sampler) == (
        "flow",
        "velocity",
        FLOW_SHIFT,
        "unipc",
    )
    assert (tok.kind, Path(tok.path), tok.spatial_compression) == ("wan", pipeline.resolve() / "vae", 8)
    assert (text.kind, Path(text.path), text.max_length) == ("t5", pipeline.resolve() / "text_encoder", 512)
    assert Path(text.tokenizer_path) == pipeline.resolve() / "tokenizer"
    model = profile.model
    assert (model.family, model.in_channels, model.text_dim, model.layers) == ("wan", 4, 16, 2)


def test_diffusers_loads_the_pipeline_folder_and_one_holding_vidforges_export(
    pipeline, imported, tmp_path
) -> None:
    from diffusers import WanPipeline

    original = WanPipeline.from_pretrained(pipeline).transformer
    copy = shutil.copytree(pipeline, tmp_path / "pipeline", ignore=shutil.ignore_patterns("transformer"))
    result = CliRunner().invoke(
        app, ["model", "export", str(imported), "--to", "diffusers", "-o", str(copy / "transformer")]
    )
    assert result.exit_code == 0, result.output
    exported = WanPipeline.from_pretrained(copy).transformer
    theirs = original.state_dict()
    assert all(torch.equal(t, theirs[name]) for name, t in exported.state_dict().items())


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("diffusion.objective=edm", "diffusion.objective: {src}'s weights were trained with flow"),
        ("model.in_channels=8", "model.in_channels: {src}'s weights have 4, the profile says 8"),
        ("model.text_dim=32", "model.text_dim: {src}'s weights have 16, the profile says 32"),
    ],
)
def test_train_init_refuses_a_profile_that_contradicts_the_weights_in_one_line(
    pipeline, tmp_path, setting, says
) -> None:
    args = ["train", "--data", str(tmp_path), "--run-dir", str(tmp_path / "run"), "--init", str(pipeline)]
    result = CliRunner().invoke(app, [*args, "--set", setting])
    assert result.exit_code == 2
    assert says.format(src=pipeline) in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_train_init_takes_the_model_from_the_folders_config(pipeline) -> None:
    from vidforge.cli.train_cmd import _init_profile

    profile = _init_profile(pipeline, None, [], None, allow_partial=False)
    assert (profile.model.family, profile.model.hidden, profile.model.heads) == ("wan", 16, 2)
    assert profile.diffusion.objective == "flow" and profile.tokenizer.kind == "wan"


def test_bench_plan_reads_the_folder_through_the_same_resolver(pipeline) -> None:
    argv = ["--json", "bench", "plan", "--profile", "dit1b_1xh200", "--model", str(pipeline), "--gpus", "1"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert '"tokens_per_step"' in result.output


def test_one_reader_of_weight_folders() -> None:
    """Only the resolver and the families' own modules look inside a published folder."""
    src = Path(__file__).resolve().parents[2] / "src" / "vidforge"
    own = {"weights/weights_folder.py"}
    calls = ("transformer_folder(", "pipeline_parts(", "read_published(", "model_from_diffusers(")
    found = [
        f"{path.relative_to(src)}: {call}"
        for path in sorted(src.rglob("*.py"))
        if "families" not in path.relative_to(src).parts and str(path.relative_to(src)) not in own
        for call in calls
        if call in path.read_text()
    ]
    assert found == []


def test_a_finetune_runs_weights_are_its_train_stages_export_else_the_error_names_where_it_looked(
    imported, tmp_path
) -> None:
    """`infer -c RUN` of a full `vidforge finetune` run: its train stage's export (RUN/train/export)."""
    from vidforge.errors import UserInputError
    from vidforge.files import FINETUNE_TRAIN
    from vidforge.infer.weights import find_weights
    from vidforge.weights.weights_folder import weights_model

    run = tmp_path / "finetune"
    shutil.copytree(find_weights(imported).export, run / FINETUNE_TRAIN / "export")
    found = find_weights(run)
    assert found.export == run / "train" / "export"
    assert weights_model(found) == weights_model(find_weights(imported))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError) as err:
        find_weights(tmp_path / "empty")
    message = str(err.value)
    assert "\n" not in message and message.startswith("--checkpoint ")
    for place in ("empty/export", "empty/train/export", f"{tmp_path / 'empty'},"):
        assert place in message, place


def test_model_export_of_a_finetune_run_writes_its_train_stages_export(pipeline, imported, tmp_path) -> None:
    """`model export RUN --to diffusers` of a full `vidforge finetune` run: diffusers loads the weights the
    published folder holds."""
    from diffusers import WanTransformer3DModel

    from vidforge.files import FINETUNE_TRAIN
    from vidforge.infer.weights import find_export

    run = tmp_path / "finetune"
    shutil.copytree(find_export(imported), run / FINETUNE_TRAIN / "export")
    out = tmp_path / "transformer"
    result = CliRunner().invoke(app, ["model", "export", str(run), "--to", "diffusers", "-o", str(out)])
    assert result.exit_code == 0, result.output
    theirs = WanTransformer3DModel.from_pretrained(pipeline / "transformer").state_dict()
    exported = WanTransformer3DModel.from_pretrained(out).state_dict()
    assert exported.keys() == theirs.keys() and all(torch.equal(t, theirs[n]) for n, t in exported.items())
