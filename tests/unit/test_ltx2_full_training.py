"""A full (non-LoRA) fine-tune of LTX-2's video path: `vidforge finetune --full` of a tiny published
folder (tests/ltx2_fixtures.py) steps on the flow objective, step 1's loss equal to that objective computed
directly in float64 with diffusers' LTX2VideoTransformer3DModel (audio isolated) on the same batch, noise
and shifted logit-normal time the trainer drew; the diffusers folder it exports loads in `from_pretrained`
with the outputs of vidforge's trained network, which the steps moved away from the base's; and a full
fine-tune from that fine-tune's export exports too (the published parts found down the chain of bases)."""

import json

import torch
from diffusers import LTX2VideoTransformer3DModel
from ltx2_fixtures import save_tiny_pipeline
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.media import write_video
from vidforge.data.testing import synthetic_frames
from vidforge.tokens import unpatchify
from vidforge.train.loss import DenoisingLoss
from vidforge.weights.checkpoint import load_model

HERE = ("cluster.accelerator=cpu", "curation.decode_workers=0", "curation.transcode_workers=0",
        "curation.caption.decode_workers=0", "data.prefetch=0", "data.buckets=[[64,96]]",
        "data.frame_buckets=[9]", "train.precision=fp32", "train.lr=1e-3")  # fmt: skip
CHANNELS = 4  # the fixture's latent channels (patch 1 x 1 x 1: a token is one latent position)


def _video(transformer, x: torch.Tensor, t: torch.Tensor, text, mask, grid) -> torch.Tensor:
    """diffusers' transformer's video output on (B, F*H*W, C) latents at flow time t (audio isolated)."""
    b = x.shape[0]
    mask = mask.long()
    with torch.no_grad():
        video, _ = transformer(
            hidden_states=x, audio_hidden_states=torch.zeros(b, 1, 4, dtype=x.dtype),
            encoder_hidden_states=text, audio_encoder_hidden_states=torch.zeros_like(text),
            timestep=t * 1000, sigma=t * 1000, encoder_attention_mask=mask, audio_encoder_attention_mask=mask,
            num_frames=grid[0], height=grid[1], width=grid[2], fps=24.0, audio_num_frames=1,
            isolate_modalities=True, return_dict=False,
        )  # fmt: skip
    return video


def test_full_training_steps_on_the_flow_loss_and_exports_to_diffusers(tmp_path, monkeypatch) -> None:
    folder = save_tiny_pipeline(tmp_path / "pipeline")
    videos = tmp_path / "videos"
    videos.mkdir()
    for i, text in enumerate(("a red square moving right", "a blue square moving left")):
        write_video(videos / f"clip{i}.mp4", synthetic_frames(12, 64, 96, i), fps=24)
        (videos / f"clip{i}.txt").write_text(text)
    seen = []
    draw = DenoisingLoss.draw

    def recording(self, batch, device, shard_of=None):
        drawn = draw(self, batch, device, shard_of)
        seen.append((batch, drawn))
        return drawn

    monkeypatch.setattr(DenoisingLoss, "draw", recording)
    run = tmp_path / "run"
    argv = ["finetune", videos, "--base", folder, "-o", run, "--steps", 2, "--validate-every", 0, "--full"]
    result = CliRunner().invoke(app, [str(a) for a in (*argv, *[a for s in HERE for a in ("--set", s)])])
    assert result.exit_code == 0, result.output[-3000:]
    monkeypatch.undo()
    steps = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and len(seen) == 2
    assert "  lora: null" in (run / "train" / "profile.yaml").read_text()

    # step 1's loss: the velocity objective computed directly, diffusers' transformer on the clean latents,
    # the noise and the time vidforge drew (noise = x + (1 - t) target for x = (1 - t) clean + t noise)
    batch, drawn = seen[0]
    assert not drawn.model_kwargs["drop_text"].any()
    ref = LTX2VideoTransformer3DModel.from_pretrained(folder / "transformer").eval()
    grid = tuple(batch.latents.shape[2:])
    t = drawn.level.double()
    t_b = t[:, None, None, None, None]
    clean = batch.latents.double()
    noise = unpatchify((drawn.x + (1 - t[:, None, None]) * drawn.target).double(), grid, (1, 1, 1), CHANNELS)
    noisy = (1 - t_b) * clean + t_b * noise
    text, mask = batch.text_emb.double(), batch.text_mask
    direct = _video(ref.double(), noisy.flatten(2).transpose(1, 2), t, text, mask, grid)
    velocity = direct.transpose(1, 2).unflatten(2, grid)
    loss = (velocity - (noise - clean)).square().mean().item()
    assert abs(steps[0]["loss"] - loss) <= 1e-5 * abs(loss)

    # the finetune's diffusers export loads with the trained network's outputs, which the steps moved
    exported = LTX2VideoTransformer3DModel.from_pretrained(run / "diffusers" / "transformer").eval()
    batch, drawn = seen[1]  # step 2's noisy latents, times and captions
    inp = (drawn.x.float(), drawn.level.float(), batch.text_emb.float(), batch.text_mask, grid)
    with torch.no_grad():
        trained = load_model(run / "train" / "export").eval()(drawn.x.float(), **drawn.model_kwargs)
    torch.testing.assert_close(_video(exported, *inp), trained, rtol=1e-5, atol=1e-5)
    assert (trained - _video(ref.float(), *inp)).abs().max() > 1e-3
    _fine_tune_of_the_export_exports(run, tmp_path)


def _fine_tune_of_the_export_exports(run, tmp_path) -> None:
    """A full fine-tune --init the first one's export (which records the pipeline as its base) exports with
    the audio stream and config entries of the published folder two bases down."""
    second = tmp_path / "second"
    argv = ["train", "--data", run / "latents", "--run-dir", second, "--init", run / "train" / "export"]
    argv += ["--profile", run / "train" / "profile.yaml", "--set", "train.steps=1"]
    result = CliRunner().invoke(app, [str(a) for a in argv])
    assert result.exit_code == 0, result.output[-3000:]
    out = tmp_path / "second_diffusers"
    result = CliRunner().invoke(
        app, ["model", "export", str(second / "export"), "--to", "diffusers", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output[-3000:]
    exported = LTX2VideoTransformer3DModel.from_pretrained(out).state_dict()
    trained = load_model(second / "export").state_dict()
    assert trained.keys() < exported.keys()  # and the audio stream's
    assert all(torch.equal(exported[name], tensor) for name, tensor in trained.items())
    first = LTX2VideoTransformer3DModel.from_pretrained(run / "diffusers" / "transformer").state_dict()
    assert any(not torch.equal(first[name], tensor) for name, tensor in trained.items())
