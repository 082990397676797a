"""Checkpoints: safetensors + config.json round trip, without unpickling anything."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from vidforge.models import build_model, model_config
from vidforge.weights.checkpoint import load_model, save_model


def test_save_then_load_gives_the_same_model(tmp_path, monkeypatch):
    cfg = model_config(
        "tiny", architecture="stdit", stdit_block="parallel", adaln_lora_rank=4, mlp_act="swiglu"
    )
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_model(model, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["model"]["stdit_block"] == "parallel"

    def no_unpickling(*args, **kwargs):
        raise AssertionError("a checkpoint load must not unpickle")

    monkeypatch.setattr(torch, "load", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    loaded = load_model(tmp_path / "ckpt")

    assert loaded.config == cfg
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    x, text = torch.randn(1, 4, 2, 4, 4), torch.randn(1, 3, 32)
    torch.testing.assert_close(loaded(x, torch.ones(1), text), model(x, torch.ones(1), text))


def test_load_refuses_weights_that_do_not_match_the_config(tmp_path):
    save_model(build_model(model_config("tiny")), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights.pop("final.proj.weight")
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="missing"):
        load_model(tmp_path)


def test_load_needs_a_config(tmp_path):
    with pytest.raises(ValueError, match="no model config"):
        load_model(tmp_path)
