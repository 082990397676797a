"""Training LTX-2's video path. The objective a published folder's profile trains with is rectified flow
predicting the velocity at LTX-Video-Trainer's shifted logit-normal times, t = sigmoid(N(mu, 1)) with mu
linear in the sample's token count between (1024, 0.95) and (4096, 2.05) (its
ShiftedLogitNormalTimestepSampler; the scheduler's dynamic shift): one training draw and loss held to that
computation written out, with diffusers' LTX2VideoTransformer3DModel (audio isolated) as the network.
`vidforge finetune` of the folder shards its captions with Gemma 3 through the text connector (each stored
caption the pipeline's encode_prompt + connectors, float16), tokenizes with its VAE and trains a LoRA
step from `--init`."""

import io
import json
import tarfile

import numpy as np
import torch
from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.batching import BucketBatch
from vidforge.data.media import write_video
from vidforge.data.testing import synthetic_frames
from vidforge.diffusion import build_objective
from vidforge.train.loss import DenoisingLoss
from vidforge.weights.weights_folder import find_weights, load_published, published_profile

CAPTIONS = ("a red square moving right", "a blue square moving left")
HERE = ("cluster.accelerator=cpu", "curation.decode_workers=0", "curation.transcode_workers=0",
        "curation.caption.decode_workers=0", "data.prefetch=0", "data.buckets=[[64,96]]",
        "data.frame_buckets=[9]")  # fmt: skip


def trainer_times(n: int, tokens: int) -> torch.Tensor:
    """LTX-Video-Trainer's ShiftedLogitNormalTimestepSampler.sample(n, tokens), written out."""
    mu = 0.95 + (2.05 - 0.95) / (4096 - 1024) * (tokens - 1024)
    return torch.sigmoid(torch.randn(n) * 1.0 + mu)


def test_a_training_draw_and_loss_are_ltx_trainers_flow_objective(ltx2_folder) -> None:
    folder = ltx2_folder()
    published = find_weights(folder).published
    profile = published_profile(published, [])
    loss = DenoisingLoss(build_objective(profile.diffusion), 0.0, (1, 1, 1), 4, 16)
    g = torch.Generator().manual_seed(0)
    clean = torch.randn(2, 4, 2, 2, 3, generator=g)  # 12 tokens a sample
    text, mask = torch.randn(2, 7, 16, generator=g), torch.ones(2, 7, dtype=torch.bool)
    torch.manual_seed(1)
    inputs = loss.draw(BucketBatch(clean, text, mask, [], []), torch.device("cpu"))
    network = load_published(published, runtime=profile.model)
    with torch.no_grad():
        ours = loss.reduce(network(inputs.x, **inputs.model_kwargs), inputs).loss

    torch.manual_seed(1)  # the same draws, in the same order: times, caption dropout, noise
    t = trainer_times(2, 12)
    torch.rand(2)
    noise = torch.randn(clean.shape)
    t_b = t[:, None, None, None, None]
    noisy, target = (1 - t_b) * clean + t_b * noise, noise - clean
    torch.testing.assert_close(inputs.level, t, rtol=1e-6, atol=1e-7)  # shift e^mu of sigmoid(N(0, 1))
    reference = LTX2VideoTransformer3DModel.from_pretrained(folder / "transformer")
    with torch.no_grad():
        video, _ = reference(
            hidden_states=noisy.flatten(2).transpose(1, 2), audio_hidden_states=torch.zeros(2, 1, 4),
            encoder_hidden_states=text, audio_encoder_hidden_states=torch.zeros(2, 7, 16),
            timestep=t * 1000, sigma=t * 1000, encoder_attention_mask=mask.long(),
            audio_encoder_attention_mask=mask.long(), num_frames=2, height=2, width=3, fps=24.0,
            audio_num_frames=1, isolate_modalities=True, return_dict=False,
        )  # fmt: skip
    direct = (video.transpose(1, 2).unflatten(2, (2, 2, 3)) - target).square().mean()
    torch.testing.assert_close(ours, direct, rtol=1e-5, atol=1e-6)


def _samples(tar_path):
    """{key: {suffix: bytes}} of a shard."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            key, _, suffix = member.name.partition(".")
            samples.setdefault(key, {})[suffix] = tar.extractfile(member).read()
    return samples


def test_finetune_shards_with_the_pipelines_encoders_and_trains_a_lora_step(tmp_path, ltx2_folder) -> None:
    folder = ltx2_folder()
    videos = tmp_path / "videos"
    videos.mkdir()
    for i, caption in enumerate(CAPTIONS):
        write_video(videos / f"clip{i}.mp4", synthetic_frames(12, 64, 96, i), fps=24)
        (videos / f"clip{i}.txt").write_text(caption)
    run = tmp_path / "run"
    argv = ["finetune", str(videos), "--base", str(folder), "-o", str(run), "--steps", "1",
            "--validate-every", "0"]  # fmt: skip
    result = CliRunner().invoke(app, argv + [a for s in HERE for a in ("--set", s)])
    assert result.exit_code == 0, result.output

    pipe = LTX2Pipeline.from_pretrained(folder)
    index = json.loads((run / "latents" / "index.json").read_text())
    assert (index["text_encoder"]["kind"], index["tokenizer"]["class"]) == (
        "family",
        "AutoencoderKLLTX2Video",
    )
    samples = _samples(run / "latents" / "train-000000.tar")
    assert sorted(s["txt"].decode() for s in samples.values()) == sorted(CAPTIONS)
    for sample in samples.values():
        stored = np.load(io.BytesIO(sample["text_emb.npy"]))
        with torch.no_grad():
            embeds, embeds_mask, _, _ = pipe.encode_prompt(
                [sample["txt"].decode()], do_classifier_free_guidance=False, device="cpu"
            )
            theirs, _, theirs_mask = pipe.connectors(embeds, embeds_mask, padding_side="left")
        assert np.array_equal(stored, (theirs * theirs_mask[..., None])[0].half().numpy())
        latent = np.load(io.BytesIO(sample["latent.npy"]))
        assert latent.shape == (4, 2, 2, 3) and np.isfinite(latent).all()  # 9 frames of 64 x 96

    profile = (run / "train" / "profile.yaml").read_text()
    assert "objective: flow" in profile and "lora:" in profile
    steps = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1] and np.isfinite(steps[0]["loss"])
