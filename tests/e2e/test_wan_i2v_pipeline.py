"""Wan2.1-I2V end to end on the CPU, from a tiny random WanImageToVideoPipeline folder as the download lays it
out (tests/wan_i2v_fixtures.py): `model import` writes its profile (its VAE, umT5 and CLIP), `shard` and
`tokenize` with it keep each clip's condition latents and first-frame embedding, `train --init` the folder
conditions on them, and `infer --image` samples the run. The model's input during training is held to
the pipeline's own: its condition channels equal `prepare_latents`' on each clip's first frame, its image
tokens `encode_image`'s."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.testing import make_annotated_dir

pytest.importorskip("transformers")
from wan_i2v_fixtures import LATENT, MASK, save_tiny_wan_i2v_pipeline  # noqa: E402

SIZES = [
    "data.buckets=[[32,32]]", "data.frame_buckets=[5]", "data.val_fraction=0", "data.token_budget=64",
    "text_encoder.max_length=8", "train.steps=2", "train.warmup_steps=1", "train.log_every=1",
    "train.precision=fp32", "train.save_every=2", "train.validate_every=0",
    "infer.frames=5", "infer.height=32", "infer.width=32", "diffusion.steps=2",
]  # fmt: skip


def _invoke(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.stdout[-2000:], result.stderr[-2000:])


def _sets() -> list[str]:
    return [arg for s in SIZES for arg in ("--set", s)]


def _first_frames(shards: Path, profile) -> dict[str, np.ndarray]:
    """Each clip's first frame as tokenize fits it to its bucket, by key."""
    from vidforge.data.shard_index import read_index
    from vidforge.data.shard_reader import check_shard
    from vidforge.tokenizers.tokenize import prepare

    index = read_index(shards)
    frames = {}
    for entry in index.shards:
        path = index.path(entry)
        for sample in check_shard(path, entry, "sha256"):
            prepared = prepare(path, sample, profile.data)
            frames[prepared.key] = prepared.video[0]
    return frames


@pytest.mark.slow(minutes=1)
def test_i2v_folder_tokenizes_trains_on_the_pipelines_conditioning_and_samples(tmp_path, monkeypatch):
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    from vidforge.families.wan.network import WanTransformer
    from vidforge.profile import load_profile
    from vidforge.tokens import unpack_tokens, unpatchify

    folder = save_tiny_wan_i2v_pipeline(tmp_path / "Wan2.1-I2V-tiny-Diffusers")
    _invoke("model", "import", str(folder), "-o", str(tmp_path / "imported"))
    profile_path = str(tmp_path / "imported" / "profile.yaml")
    annotated = make_annotated_dir(
        tmp_path / "annotated", videos=3, images=0, rejected=0, size=(32, 32), frames=(5, 6)
    )
    _invoke("shard", str(annotated), "-o", str(tmp_path / "shards"), "-p", profile_path, *_sets())
    _invoke(
        "tokenize", str(tmp_path / "shards"), "-o", str(tmp_path / "latents"), "-p", profile_path, *_sets()
    )

    seen: list[dict] = []
    forward = WanTransformer.forward

    def recording(self, x, *args, **kwargs):
        if x.device.type != "meta":  # the step's FLOP count runs a meta copy of the model: not a sample
            seen.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in kwargs.items()})
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(WanTransformer, "forward", recording)
    run = tmp_path / "run"
    _invoke(
        "train", "--data", str(tmp_path / "latents"), "--run-dir", str(run), "--init", str(folder), *_sets()
    )
    monkeypatch.undo()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(np.isfinite(m["loss"]) for m in metrics)

    # every sample the model trained on: its condition channels and image tokens are the pipeline's
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    profile = load_profile(profile_path, SIZES)
    firsts = list(_first_frames(tmp_path / "shards", profile).values())
    expected = []
    for frame in firsts:
        image = torch.from_numpy(frame).permute(2, 0, 1)[None].float() / 127.5 - 1
        _, condition = pipe.prepare_latents(image, 1, LATENT, 32, 32, 5, torch.float32, "cpu")
        expected.append((condition[0], pipe.encode_image(Image.fromarray(frame), "cpu")[0]))
    assert seen
    checked = 0
    for call in seen:
        if "layout" in call and call["layout"] is not None:
            conditions = unpack_tokens(call["condition"], call["layout"], (1, 2, 2))
        else:
            conditions = list(unpatchify(call["condition"], call["grid"], (1, 2, 2), MASK + LATENT))
        for condition, image in zip(conditions, call["image"], strict=True):
            match = [i for i, (c, _) in enumerate(expected) if torch.allclose(c, condition, atol=1e-5)]
            assert len(match) == 1, "the model's condition channels are no clip's prepare_latents"
            # the stored embedding is float16, as the captions' are
            torch.testing.assert_close(image, expected[match[0]][1], rtol=2e-3, atol=2e-3)
            checked += 1
    assert checked >= 2

    # the run samples from a first frame; without one it is refused in one line
    Image.fromarray(firsts[0]).save(tmp_path / "first.png")
    _invoke("infer", "-c", str(run), "--prompt", "a red square", "--image", str(tmp_path / "first.png"),
            "-o", str(tmp_path / "out"))  # fmt: skip
    record = json.loads((tmp_path / "out" / "samples.jsonl").read_text())
    assert record["image"] == str((tmp_path / "first.png").resolve())
    assert (tmp_path / "out" / record["video"]).stat().st_size > 0
    refused = CliRunner().invoke(app, ["infer", "-c", str(run), "--prompt", "a", "-o", str(tmp_path / "no")])
    assert refused.exit_code == 2 and "give the first frame to animate with --image PATH" in refused.output

    # README's LoRA recipe: an adapter on the folder, sampled from the folder with it and a first frame
    lora = tmp_path / "lora"
    _invoke("train", "--data", str(tmp_path / "latents"), "--run-dir", str(lora), "--init", str(folder), *_sets(),
            "--set", "train.lora.rank=4", "--set", "train.lora.alpha=4", "--set", "train.steps=1")  # fmt: skip
    _invoke("infer", "-c", str(folder), "--lora", str(lora), "--image", str(tmp_path / "first.png"), "--prompt", "a",
            "-o", str(tmp_path / "lora_out"), *_sets())  # fmt: skip
    assert json.loads((tmp_path / "lora_out" / "samples.jsonl").read_text())["lora"] == str(lora.resolve())
