"""`vidforge train --init`: training starts from given weights, by name, exactly; a partial match is
refused unless allowed, and the report says what was loaded, new, reshaped or unused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.errors import UserInputError
from vidforge.models import build_model
from vidforge.parallel.dims import ParallelDims
from vidforge.parallel.runtime import Runtime
from vidforge.profile import load_profile
from vidforge.train.build import build
from vidforge.train.init_weights import WeightsInit
from vidforge.weights.checkpoint import load_model, save_model

SETS = ["model.hidden=32", "model.mlp_hidden=64", "model.heads=2", "model.text_dim=8", "model.in_channels=4"]


def _runtime(profile) -> Runtime:
    return Runtime(0, 1, 0, torch.device("cpu"), ParallelDims(profile.layout))


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """An export of a trained-looking model: random weights far from the builder's initialisation."""
    profile = load_profile("local_cpu", SETS)
    torch.manual_seed(123)
    model = build_model(profile.model)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return save_model(model, tmp_path / "export")


def _forward(model, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 2, 4, 4, generator=g)
    text = torch.randn(2, 3, 8, generator=g)
    with torch.no_grad():
        return model(x, torch.tensor([0.1, -0.5]), text)


def test_init_from_an_export_reproduces_its_forward_exactly(export) -> None:
    profile = load_profile("local_cpu", SETS)
    parts = build(profile, _runtime(profile), WeightsInit(export))
    assert torch.equal(_forward(parts.modules[0]), _forward(load_model(export)))
    assert any("tensors loaded" in note for note in parts.notes)
    # the EMA starts from the loaded weights too
    shadow = parts.ema.state_dict() if parts.ema is not None else {}
    for name, p in load_model(export).named_parameters():
        if name in shadow:
            torch.testing.assert_close(shadow[name], p.float())


def test_a_grown_model_loads_what_matches_only_when_allowed(export) -> None:
    grown = load_profile("local_cpu", [*SETS, "model.layers=3"])  # the export has 2 blocks
    with pytest.raises(UserInputError, match=r"tensors loaded, \d+ new \(blocks\.2\..*--allow-partial"):
        build(grown, _runtime(grown), WeightsInit(export))
    parts = build(grown, _runtime(grown), WeightsInit(export, allow_partial=True))
    model, source = parts.modules[0], load_model(export)
    mine = dict(model.named_parameters())
    for name, p in source.named_parameters():
        assert torch.equal(mine[name], p), name  # every tensor that fits came from the export
    assert "blocks.2." in parts.notes[0] and "new" in parts.notes[0]


def test_weights_of_another_shape_are_reported_not_loaded(export) -> None:
    wider = load_profile("local_cpu", [*SETS, "model.mlp_hidden=96"])
    parts = build(wider, _runtime(wider), WeightsInit(export, allow_partial=True))
    assert "of another shape" in parts.notes[0] and "mlp" in parts.notes[0]


def test_init_from_a_diffusers_wan_folder(tmp_path: Path) -> None:
    """The wan family's tensor names are diffusers' own: a WanTransformer3DModel folder loads as is."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    reference = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=8, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
    )  # fmt: skip
    reference.save_pretrained(tmp_path / "transformer")
    from vidforge.families.wan.weights import load_diffusers_wan

    expected = load_diffusers_wan(tmp_path / "transformer")
    profile = load_profile(
        "local_cpu",
        [
            "model.family=wan", "model.mlp_act=gelu-tanh", "model.adaln_lora_rank=0",
            "model.abs_position=none", "model.cross_attn_norm=true", "model.hidden=16", "model.heads=2",
            "model.mlp_hidden=32", "model.layers=2", "model.in_channels=4", "model.text_dim=8",
            "model.patch=[1,2,2]",
        ],
    )  # fmt: skip
    parts = build(profile, _runtime(profile), WeightsInit(tmp_path / "transformer"))
    assert torch.equal(_forward(parts.modules[0]), _forward(expected))


def test_train_cli_refuses_an_init_path_that_holds_no_weights(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--data",
            str(tmp_path),
            "--run-dir",
            str(tmp_path / "run"),
            "--init",
            str(tmp_path / "empty"),
        ],
    )
    assert result.exit_code == 2
    assert "--init" in result.stderr and "point at RUN/export" in result.stderr
