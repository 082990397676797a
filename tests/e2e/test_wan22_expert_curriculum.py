"""README's "Both Wan2.2 A14B experts in one curriculum" on a tiny random two-expert download
(`wan22_fixtures`): `stages` of train.expert=high then low, each stage starting from its own expert's
weights in the download (not from the stage before, the other expert), and the run sampling with both
trained experts: `infer -c RUN` for a full fine-tune (after a --resume too), `infer -c DOWNLOAD --lora RUN`
for LoRA."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.testing import make_latent_shards

pytest.importorskip("transformers")
from wan22_fixtures import save_tiny_wan22_pipeline  # noqa: E402

LR = 1e-3  # AdamW's first step moves each weight by about lr: a stage's export stays within 2 lr of its start
SIZES = [
    "data.buckets=[[32,32]]", "data.frame_buckets=[5]", "data.val_fraction=0", "data.token_budget=64",
    "train.warmup_steps=0", "train.log_every=1", "train.precision=fp32", "train.save_every=1",
    f"train.lr={LR}", "text_encoder.max_length=8",
    "stages=[{name: high, steps: 1, expert: high}, {name: low, steps: 1, expert: low}]",
]  # fmt: skip
SMALL = [
    "infer.frames=5",
    "infer.height=32",
    "infer.width=32",
    "diffusion.steps=4",
    "text_encoder.max_length=8",
]


def _sets(items: list[str]) -> list[str]:
    return [arg for s in items for arg in ("--set", s)]


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.stdout[-2000:], result.stderr[-2000:])
    return result.output


def _states_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    theirs = b.state_dict()
    return all(torch.equal(t, theirs[n]) for n, t in a.state_dict().items())


@pytest.fixture(scope="module")
def download(tmp_path_factory):
    """The tiny two-expert folder, its experts as published, and latents to train on."""
    from vidforge.families.wan.weights import load_diffusers_wan

    root = tmp_path_factory.mktemp("a14b")
    pipeline = save_tiny_wan22_pipeline(root / "Wan2.2-T2V-A14B-tiny-Diffusers")
    latents = make_latent_shards(
        root / "latents", shards=1, per_shard=2, channels=4, shapes=((2, 4, 4),), text_shape=(8, 16)
    )
    published = {e: load_diffusers_wan(pipeline / f).eval() for e, f in (("high", "transformer"), ("low", "transformer_2"))}  # fmt: skip
    return pipeline, latents, published


def test_each_stage_starts_from_its_own_expert_and_infer_samples_both_trained(download, tmp_path) -> None:
    from vidforge.infer.weights import find_weights, load_network
    from vidforge.weights.experts import load_export

    pipeline, latents, published = download
    run = tmp_path / "full"
    _invoke("train", "--data", str(latents), "--init", str(pipeline), "--run-dir", str(run), *_sets(SIZES))
    stages = {
        e: load_export(run / "stages" / f"0{i}-{e}" / "export").eval() for i, e in ((1, "high"), (2, "low"))
    }
    for expert, trained in stages.items():  # each stage started from its own expert's download weights
        start = published[expert].state_dict()
        moved = max((t - start[n]).abs().max().item() for n, t in trained.state_dict().items())
        assert 0 < moved < 2 * LR, (expert, moved)
    # infer -c RUN samples with both trained experts (the last stage's export names the other's)
    pair = load_network(find_weights(run), "cpu")
    assert _states_equal(pair.high, stages["high"]) and _states_equal(pair.low, stages["low"])
    assert not _states_equal(pair.high, published["high"]) and not _states_equal(pair.low, published["low"])
    _invoke("infer", "-c", str(run), "--prompt", "a red square", "-o", str(tmp_path / "out"), *_sets(SMALL))
    assert json.loads((tmp_path / "out" / "samples.jsonl").read_text())["frames"] == 5
    # --resume with the low stage given a step more: the high stage passes, the low one trains on from
    # its checkpoint and still names the high stage's export
    longer = [s.replace("steps: 1, expert: low", "steps: 2, expert: low") for s in SIZES]
    _invoke("train", "--data", str(latents), "--init", str(pipeline), "--run-dir", str(run), "--resume",
            *_sets(longer))  # fmt: skip
    low = load_export(run / "stages" / "02-low" / "export").eval()
    assert not _states_equal(low, stages["low"])
    pair = load_network(find_weights(run), "cpu")
    assert _states_equal(pair.high, stages["high"]) and _states_equal(pair.low, low)


def test_a_lora_curriculum_puts_each_stage_adapter_on_its_own_expert(download, tmp_path) -> None:
    """What `infer -c DOWNLOAD --lora RUN` loads (`load_network`) against each stage's adapter on its
    published expert, loaded by hand."""
    from vidforge.infer.weights import find_weights, load_network
    from vidforge.lora import load_adapter

    pipeline, latents, published = download
    lora = tmp_path / "lora"
    _invoke("train", "--data", str(latents), "--init", str(pipeline), "--run-dir", str(lora), *_sets(SIZES),
            "--set", "train.lora.rank=4", "--set", "train.lora.alpha=4", "--set", "train.lr=1e-2")  # fmt: skip
    both = load_network(find_weights(pipeline), "cpu", lora=lora)
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 4, 2, 4, 4, generator=g), torch.randn(1, 3, 16, generator=g)
    for i, expert in ((1, "high"), (2, "low")):
        t = torch.tensor([0.95 if expert == "high" else 0.4])
        with torch.no_grad():
            base = published[expert](x, t, text)
            by_hand = load_adapter(published[expert], lora / "stages" / f"0{i}-{expert}" / "export")(
                x, t, text
            )
            ours = getattr(both, expert)(x, t, text)
        assert (by_hand - base).abs().max() > 1e-4, expert  # the adapter trained
        torch.testing.assert_close(ours, by_hand, rtol=1e-5, atol=1e-5)
