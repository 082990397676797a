"""README's "LoRA on one Wan2.2 A14B expert" on a tiny random two-expert download (`wan22_fixtures`):
`train --init FOLDER --set train.expert=low` with LoRA, its adapter loaded by diffusers into the pipeline's
transformer_2 (`load_lora_weights(..., load_into_transformer_2=True)`) computes what vidforge's low-noise
expert with it computes, and so does `model export --merged` of it; `infer -c FOLDER --lora RUN` samples with it; `model import` brings both experts; a full fine-tune of one
expert samples beside the download's other one."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.testing import make_latent_shards

pytest.importorskip("transformers")
from wan22_fixtures import save_tiny_wan22_pipeline  # noqa: E402

SIZES = [
    "data.buckets=[[32,32]]", "data.frame_buckets=[5]", "data.val_fraction=0", "data.token_budget=64",
    "train.steps=3", "train.warmup_steps=1", "train.log_every=1", "train.precision=fp32", "train.save_every=3",
    "train.lr=1e-2", "train.lora.rank=4", "train.lora.alpha=4",
    "text_encoder.max_length=8",
]  # fmt: skip
SMALL = [
    "text_encoder.max_length=8",
    "infer.frames=5",
    "infer.height=32",
    "infer.width=32",
    "diffusion.steps=4",
]


def _sets(items: list[str]) -> list[str]:
    return [arg for s in items for arg in ("--set", s)]


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.stdout[-2000:], result.stderr[-2000:])
    return result.output


def test_a_lora_on_the_low_noise_expert_trains_loads_in_diffusers_and_samples(tmp_path) -> None:
    pipeline = save_tiny_wan22_pipeline(tmp_path / "Wan2.2-T2V-A14B-tiny-Diffusers")
    latents = make_latent_shards(
        tmp_path / "latents", shards=1, per_shard=2, channels=4, shapes=((2, 4, 4),), text_shape=(8, 16)
    )
    train = ["train", "--data", str(latents), "--init", str(pipeline), *_sets(SIZES)]
    refused = CliRunner().invoke(app, [*train, "--run-dir", str(tmp_path / "none")])
    assert refused.exit_code == 2 and "train.expert: a two-expert model" in refused.output
    run = tmp_path / "run"
    said = _invoke(*train, "--run-dir", str(run), "--set", "train.expert=low")
    assert "validation off: the low-noise expert alone" in said  # a fine-tune's default, but not here

    from diffusers import WanPipeline

    from vidforge.families.wan.weights import load_diffusers_wan
    from vidforge.lora import load_adapter

    pipe = WanPipeline.from_pretrained(pipeline)
    pipe.load_lora_weights(run / "export", load_into_transformer_2=True)
    base = load_diffusers_wan(pipeline / "transformer_2").eval()
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 4, 2, 4, 4, generator=g), torch.randn(1, 3, 16, generator=g)
    t = torch.tensor([0.4])
    with torch.no_grad():
        before = base(x, t, text)
        ours = load_adapter(base, run / "export")(x, t, text)
        theirs = pipe.transformer_2(x, t * 1000, text, return_dict=False)[0]
        untouched = pipe.transformer(x, t * 1000, text, return_dict=False)[0]
    assert (ours - before).abs().max() > 1e-4  # the adapter trained
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    high = load_diffusers_wan(pipeline).eval()
    with torch.no_grad():
        torch.testing.assert_close(untouched, high(x, t, text), rtol=1e-5, atol=1e-5)
    # merged into its own expert's weights: a transformer_2/ folder for the download
    _invoke("model", "export", str(run), "--merged", "-o", str(tmp_path / "merged" / "transformer_2"))
    merged = load_diffusers_wan(tmp_path / "merged" / "transformer_2").eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(x, t, text), ours, rtol=1e-5, atol=1e-5)

    # the download samples with the adapter on its low-noise expert
    _invoke("infer", "-c", str(pipeline), "--lora", str(run), "--prompt", "a red square", "-o",
            str(tmp_path / "out"), *_sets(SMALL))  # fmt: skip
    record = json.loads((tmp_path / "out" / "samples.jsonl").read_text())
    assert (record["guidance"], record["guidance_2"]) == (4.0, 3.0)
    # and so does its import: both experts, the low-noise one in low_noise/
    imported = tmp_path / "imported"
    _invoke("model", "import", str(pipeline), "-o", str(imported))
    assert (imported / "low_noise" / "model.safetensors").is_file()
    _invoke(
        "infer", "-c", str(imported), "--prompt", "a red square", "-o", str(tmp_path / "imp"), *_sets(SMALL)
    )
    assert json.loads((tmp_path / "imp" / "samples.jsonl").read_text())["frames"] == 5
    said = _invoke("model", "export", str(imported), "-o", str(tmp_path / "back" / "transformer"))
    assert "low_noise" in said and "not written" in said  # one expert a call, the other one named
    # a full fine-tune of the high-noise expert samples beside the download's low-noise one
    full = tmp_path / "full"
    full_sets = [s for s in SIZES if not s.startswith("train.lora")] + ["train.steps=1", "train.save_every=1"]
    _invoke("train", "--data", str(latents), "--init", str(pipeline), "--run-dir", str(full), *_sets(full_sets),
            "--set", "train.expert=high")  # fmt: skip
    _invoke(
        "infer", "-c", str(full), "--prompt", "a red square", "-o", str(tmp_path / "full_out"), *_sets(SMALL)
    )
    from vidforge.infer.weights import find_weights, load_network

    pair = load_network(find_weights(full), "cpu")
    theirs = load_diffusers_wan(pipeline / "transformer_2").state_dict()
    assert all(torch.equal(t, theirs[n]) for n, t in pair.low.state_dict().items())
    published_high = high.state_dict()
    assert not all(torch.equal(t, published_high[n]) for n, t in pair.high.state_dict().items())  # trained
