"""`vidforge infer` of a tiny Wan2.1 T2V diffusers folder and of its `model import`.

Nothing a user gives about the model is silently replaced by the weights' config: every `model.*` field
is either honoured (the attention kernel and sparsity, `RUNTIME_FIELDS`: the network is built with them,
and sliding-tile or sparse attention changes the video) or refused in one line (the fields the weights
fix). With DEFAULT arguments (`default_parity`: no negative prompt, guidance, shift or scheduler given)
it samples WanPipeline's latents (which encodes the empty caption for its unconditional branch) and
writes Wan2.1's 16 fps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from default_parity import PROMPT, noise, vidforge_infer

from vidforge.data.media import read_video
from vidforge.errors import UserInputError
from vidforge.families import REGISTRY, family
from vidforge.infer.run import run
from vidforge.infer.weights import find_weights, load_network, sampling_profile
from vidforge.profile.model import RUNTIME_FIELDS

pytest.importorskip("transformers")
from wan_fixtures import save_tiny_wan_pipeline  # noqa: E402

# A valid value other than the tiny folder's for every model field of every family (2 layers, 2 heads of
# 8, ffn 32, 4 latent channels, text width 16). A field added to a family's section fails the walk until
# it has one here.
OTHER = {
    "preset": "wan2.1-1.3b",
    "family": "vidforge",
    "architecture": "stdit",
    "stdit_block": "parallel",
    "context_latents": 8,
    "layers": 3,
    "hidden": 32,
    "heads": 1,
    "mlp_hidden": 64,
    "mlp_act": "swiglu",
    "patch": [1, 1, 1],
    "in_channels": 8,
    "text_dim": 32,
    "adaln_lora_rank": 4,
    "qk_norm": False,
    "cross_attn_norm": False,
    "expand_timesteps": True,
    "condition_channels": 20,
    "image_dim": 32,
    "experts": 2,
    "boundary_ratio": 0.5,
    "rope_theta": 500.0,
    "abs_position": "sincos",
    "text_pool": True,
    "attention": "dense",
    "sdpa_backend": "math",
    "attention_window": [1, 1, 1],
    "attention_tile": [1, 1, 1],
    "attention_topk": 1,
    # hunyuan15's own fields: another family's, refused on a Wan folder
    "refiner_layers": 1,
    "text_2_dim": 8,
    "text_2_tokens": 4,
    "rope_axes": [2, 2, 4],
    "task": "i2v",
    "target_size": 480,
    # ltx2's own fields: another family's, refused on a Wan folder
    "rope_type": "split",
    "rope_double_precision": False,
    "rope_base": [1.0, 2.0, 3.0],
    "vae_scale": [1, 2, 2],
    "causal_offset": 0,
    "frame_rate": 12.0,
    "gated_attention": True,
    "prompt_modulation": True,
    "prompt_modulation_per_step": False,
    "caption_projection": False,
    "ff_bias": False,
    "eps": 1e-5,
    "audio": True,
    "perturbed_attention": True,
}
HEIGHT, WIDTH, FRAMES, STEPS = 32, 48, 5, 3
SETS = [
    f"infer.height={HEIGHT}",
    f"infer.width={WIDTH}",
    f"infer.frames={FRAMES}",
    f"diffusion.steps={STEPS}",
]
SIZE = ["text_encoder.max_length=8", "infer.frames=5", "infer.height=64", "infer.width=64"]
TILE = "model.attention_tile=[1,2,2]"  # the default tile (6 x 8 x 8) does not fit the 2 x 4 x 4 token grid


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from typer.testing import CliRunner

    from vidforge.cli.app import app

    root = tmp_path_factory.mktemp("fields")
    pipeline = save_tiny_wan_pipeline(root / "Wan2.1-T2V-tiny-Diffusers")
    result = CliRunner().invoke(app, ["model", "import", str(pipeline), "-o", str(root / "imported")])
    assert result.exit_code == 0, result.output
    return {"folder": pipeline, "import": root / "imported"}


def _set(name: str, value) -> str:
    import json

    return f"model.{name}={json.dumps(value)}"


@pytest.mark.parametrize("kind", ["folder", "import"])
def test_every_model_field_given_at_infer_is_honoured_or_refused(folders, kind) -> None:
    every = {name for f in REGISTRY for name in family(f).model.model_fields}  # every family's fields
    assert set(OTHER) == every, "give every model field a value to try"
    weights = find_weights(folders[kind])
    honoured = []
    for name, value in OTHER.items():
        try:
            profile = sampling_profile(weights, [*SIZE, TILE, _set(name, value)])
        except UserInputError as err:
            assert "\n" not in str(err), (name, str(err))
            assert name in RUNTIME_FIELDS or name == "preset" or name in str(err), (name, str(err))
            continue
        assert name in RUNTIME_FIELDS, f"model.{name}={value!r} was neither refused nor a runtime field"
        model = load_network(weights, "cpu", runtime=profile.model)
        got = getattr(model.config, name)
        assert (list(got) if isinstance(got, tuple) else got) == value, name
        honoured.append(name)
    assert sorted(honoured) == sorted(RUNTIME_FIELDS)


def _video(folder: Path, out: Path, *sets: str) -> np.ndarray:
    overrides = [*SIZE, "diffusion.steps=2", *sets]
    result = run(folder, ["a red square moving right"], out, overrides=overrides)
    return read_video(result.videos[0])


def _differ(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two videos' pixels (levels of 255)."""
    assert a.shape == b.shape
    return float(np.abs(a.astype(float) - b.astype(float)).mean())


def test_sliding_tile_and_sparse_attention_change_the_video(folders, tmp_path) -> None:
    """Each attention option at infer samples another video than full attention (the token grid is
    2 x 4 x 4: a window of one 1 x 2 x 2 tile, or the one best tile, sees an eighth of it): measured 2.2
    and 2.6 levels apart on average, where sampling full attention with the dense kernel instead of SDPA
    moves it by rounding alone, 0.01; the import samples the window as the folder does."""
    full = _video(folders["folder"], tmp_path / "full")
    for option, sets in {
        "window": ("model.attention_window=[1,1,1]", TILE),
        "top-k": ("model.attention_topk=1", TILE),
        "per-layer window": ("model.attention_window=[[1,1,1],null]", TILE),  # a list once crashed lru_cache
    }.items():
        kind = "import" if option == "window" else "folder"
        assert _differ(full, _video(folders[kind], tmp_path / option, *sets)) > 0.5, option


def test_default_infer_equals_wan_pipeline_and_writes_16_fps(folders, tmp_path, monkeypatch) -> None:
    from diffusers import WanPipeline

    from vidforge.infer.weights import find_weights, sampling_profile
    from vidforge.profile import load_profile

    folder = folders["folder"]
    ours, fps, record = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch)
    assert (fps, record["negative_prompt"], record["sampler"], record["guidance"]) == (16, "", "unipc", 5.0)
    theirs = WanPipeline.from_pretrained(folder)(
        prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)
    # the profile `model import` writes samples with the same defaults
    imported = load_profile(folders["import"] / "profile.yaml")
    published = sampling_profile(find_weights(folder), [])
    for section in ("infer", "diffusion"):
        assert getattr(imported, section) == getattr(published, section)
    assert imported.infer.fps == 16


def test_model_import_keeps_the_attention_settings(folders, tmp_path) -> None:
    from typer.testing import CliRunner

    from vidforge.cli.app import app
    from vidforge.profile import load_profile
    from vidforge.weights.checkpoint import read_config

    sets = ["--set", "model.attention_window=[1,1,1]", "--set", TILE]
    out = tmp_path / "windowed"
    result = CliRunner().invoke(app, ["model", "import", str(folders["folder"]), "-o", str(out), *sets])
    assert result.exit_code == 0, result.output
    for model in (read_config(out), load_profile(out / "profile.yaml").model):
        assert (model.attention_window, model.attention_tile) == ((1, 1, 1), (1, 2, 2))
    profile = sampling_profile(find_weights(out), SIZE)  # the import's own window, not set again
    assert load_network(find_weights(out), "cpu", runtime=profile.model).config.attention_window == (1, 1, 1)
