"""Wan2.2 TI2V-5B end to end on the CPU, from a tiny random diffusers folder as the download lays it out
(`WanPipeline(expand_timesteps=True).save_pretrained`: the Wan2.2 VAE, umT5, the transformer over 8
latent channels): `shard` and `tokenize` with its umT5 and Wan2.2 VAE (16x spatial), `train --init` it
with no `model.*` --set (half its clips conditioned on their first frame, as the folder's defaults say),
`infer` from the run with `--image` and from the download without; `--image` on a text-only model is
refused in one line. (`model import` and `train --init`'s profile of the folder, and sampling against
diffusers' pipelines: tests/unit/test_wan22_ti2v_sampling.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.testing import make_annotated_dir
from vidforge.profile import load_profile

transformers = pytest.importorskip("transformers")
from wan22_ti2v_fixtures import save_tiny_ti2v_pipeline  # noqa: E402

SIZES = [
    "data.buckets=[[64,64]]", "data.frame_buckets=[5]", "data.val_fraction=0", "data.token_budget=64",
    "train.steps=2", "train.warmup_steps=1", "train.log_every=1", "train.precision=fp32", "train.save_every=2",
    "train.validate_every=0", "infer.frames=5", "infer.height=64", "infer.width=64", "diffusion.steps=2",
    "diffusion.guidance=2", "text_encoder.max_length=8",
]  # fmt: skip


def _sets(*extra: str) -> list[str]:
    return [arg for s in [*SIZES, *extra] for arg in ("--set", s)]


def _invoke(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.stdout[-2000:], result.stderr[-2000:])


@pytest.mark.slow
def test_a_ti2v_folder_tokenizes_trains_and_samples_from_text_and_from_an_image(tmp_path) -> None:
    from PIL import Image

    pipe = save_tiny_ti2v_pipeline(tmp_path / "Wan2.2-TI2V-tiny-Diffusers")
    reads = [
        "text_encoder.kind=t5", f"text_encoder.path={pipe / 'text_encoder'}",
        f"text_encoder.tokenizer_path={pipe / 'tokenizer'}", "tokenizer.kind=wan", f"tokenizer.path={pipe / 'vae'}",
        "tokenizer.spatial_compression=16",
    ]  # fmt: skip
    annotated = make_annotated_dir(
        tmp_path / "annotated", videos=2, images=0, rejected=0, size=(64, 64), frames=(5, 6)
    )
    _invoke("shard", str(annotated), "-o", str(tmp_path / "shards"), *_sets(*reads))
    _invoke("tokenize", str(tmp_path / "shards"), "-o", str(tmp_path / "latents"), *_sets(*reads))
    index = json.loads((tmp_path / "latents" / "index.json").read_text())
    assert index["tokenizer"]["latent_channels"] == 8 and index["tokenizer"]["spatial_compression"] == 16
    run = tmp_path / "run"
    _invoke(
        "train", "--data", str(tmp_path / "latents"), "--run-dir", str(run), "--init", str(pipe), *_sets()
    )
    trained = load_profile(run / "export" / "profile.yaml")
    assert trained.model.expand_timesteps and trained.diffusion.image_condition == 0.5
    image = tmp_path / "first.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(image)
    prompt = ("--prompt", "a red square moving right")
    for source, out, extra in [(run, "i2v", ("--image", str(image))), (pipe, "t2v", ())]:
        _invoke("infer", "-c", str(source), *prompt, "-o", str(tmp_path / out), *extra, *_sets())
        record = json.loads((tmp_path / out / "samples.jsonl").read_text())
        assert record["sampler"] == "unipc" and record["frames"] == 5 and ("image" in record) == bool(extra)
    refused = CliRunner().invoke(
        app, ["infer", "-c", str(run), *prompt, "-o", str(tmp_path / "no"), "--image", str(image), *_sets(),
              "--set", "model.expand_timesteps=false", "--set", "diffusion.image_condition=0"],
    )  # fmt: skip
    # the weights condition on their first frame: infer does not sample them as if they did not
    assert refused.exit_code == 2 and "model.expand_timesteps: " in refused.output
    assert "weights have True, the profile says False" in refused.output
    # and a text-to-video model refuses an image in one line (the layout rulebook's sampling rules)
    from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
    from vidforge.profile.loading import validate_profile

    t2v = validate_profile({"model": {"preset": "wan2.1-1.3b"}, "diffusion": {"objective": "flow"}})
    (problem,) = sampling_run_problems(t2v, SamplingRun(1, True))
    assert problem.startswith("--image: model.family=wan with model.expand_timesteps off")
