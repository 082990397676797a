"""`vidforge finetune` of a HunyuanVideo-1.5 folder in the published layout (tiny random components of the
real classes): the folder's own encoders shard the captions (each stored caption is the pipeline's
`encode_prompt`, joined and stored as float16), its VAE tokenizes the clips, and LoRA trains a step from
`--init` of the folder with its objective (flow, velocity)."""

import io
import json
import tarfile

import numpy as np
import torch
from diffusers import HunyuanVideo15Pipeline
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.media import write_video
from vidforge.data.testing import synthetic_frames
from vidforge.families.hunyuan15.captions import join_caption

CAPTIONS = ('a shop sign reading "OPEN"', "a blue square moving left")  # glyph text in one, none in the other
HERE = ("cluster.accelerator=cpu", "curation.decode_workers=0", "curation.transcode_workers=0",
        "curation.caption.decode_workers=0", "data.prefetch=0", "data.buckets=[[64,96]]",
        "data.frame_buckets=[9]")  # fmt: skip


def _samples(tar_path):
    """{key: {suffix: bytes}} of a shard."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            key, _, suffix = member.name.partition(".")
            samples.setdefault(key, {})[suffix] = tar.extractfile(member).read()
    return samples


def test_finetune_shards_with_the_pipelines_encoders_and_trains_a_lora_step(
    tmp_path, hunyuan15_folder
) -> None:
    folder = hunyuan15_folder()
    videos = tmp_path / "videos"
    videos.mkdir()
    for i, caption in enumerate(CAPTIONS):
        write_video(videos / f"clip{i}.mp4", synthetic_frames(12, 64, 96, i), fps=24)
        (videos / f"clip{i}.txt").write_text(caption)
    run = tmp_path / "run"
    argv = [
        "finetune",
        str(videos),
        "--base",
        str(folder),
        "-o",
        str(run),
        "--steps",
        "1",
        "--validate-every",
        "0",
    ]
    result = CliRunner().invoke(app, argv + [a for s in HERE for a in ("--set", s)])
    assert result.exit_code == 0, result.output

    pipe = HunyuanVideo15Pipeline.from_pretrained(folder)
    index = json.loads((run / "latents" / "index.json").read_text())
    assert (index["text_encoder"]["kind"], index["tokenizer"]["class"]) == (
        "family",
        "AutoencoderKLHunyuanVideo15",
    )
    samples = _samples(run / "latents" / "train-000000.tar")
    assert sorted(s["txt"].decode() for s in samples.values()) == sorted(CAPTIONS)
    for sample in samples.values():
        stored = np.load(io.BytesIO(sample["text_emb.npy"]))
        mask = np.load(io.BytesIO(sample["text_mask.npy"]))
        with torch.no_grad():
            theirs, theirs_mask = join_caption(*pipe.encode_prompt([sample["txt"].decode()], device="cpu"))
        assert np.array_equal(stored, (theirs * theirs_mask[..., None])[0].half().numpy())
        assert np.array_equal(mask, theirs_mask[0].numpy())
        latent = np.load(io.BytesIO(sample["latent.npy"]))
        assert latent.shape == (4, 3, 4, 6) and np.isfinite(latent).all()  # 9 frames of 64 x 96

    profile = (run / "train" / "profile.yaml").read_text()
    assert "objective: flow" in profile and "lora:" in profile
    steps = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1] and np.isfinite(steps[0]["loss"])
    assert "--image" not in result.output  # a text-to-video model's next step samples from text
