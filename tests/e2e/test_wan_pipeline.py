"""Wan2.1 end to end on the CPU, from a diffusers pipeline folder as the download lays it out (a tiny random
one saved by WanPipeline.save_pretrained: transformer/, vae/, text_encoder/ (umT5), tokenizer/, scheduler/): `vidforge shard`
with its umT5, `vidforge tokenize` with its VAE, `vidforge train --init` it with rectified flow,
`vidforge infer` an MP4 (from the run, and from the download itself), and the export back to a folder
diffusers loads that computes vidforge's forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.testing import make_annotated_dir
from vidforge.profile import load_profile

transformers = pytest.importorskip("transformers")
from wan_fixtures import save_tiny_wan_pipeline  # noqa: E402

TEXT_LEN = 8


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    return save_tiny_wan_pipeline(tmp_path_factory.mktemp("Wan2.1-T2V-tiny-Diffusers"))


def _sets(pipe: Path) -> list[str]:
    """What shard and tokenize need to read the pipeline at `pipe` (its umT5 and VAE), tiny sizes; `train
    --init` and `infer -c` take the model, objective, VAE and text encoder from the folder itself."""
    sets = [
        "text_encoder.kind=t5", f"text_encoder.path={pipe / 'text_encoder'}",
        f"text_encoder.tokenizer_path={pipe / 'tokenizer'}", f"text_encoder.max_length={TEXT_LEN}",
        "tokenizer.kind=wan", f"tokenizer.path={pipe / 'vae'}", "tokenizer.spatial_compression=8",
        *SIZES,
    ]  # fmt: skip
    return [arg for s in sets for arg in ("--set", s)]


SIZES = [
    "data.buckets=[[32,32]]", "data.frame_buckets=[5]", "data.val_fraction=0", "data.token_budget=64",
    "train.steps=2", "train.warmup_steps=1", "train.log_every=1", "train.precision=fp32", "train.save_every=2",
    "infer.frames=5", "infer.height=32", "infer.width=32", "diffusion.steps=3", "diffusion.guidance=2",
]  # fmt: skip


def _invoke(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.stdout[-2000:], result.stderr[-2000:])


def test_a_wan_pipeline_folder_tokenizes_trains_samples_and_exports(pipeline, tmp_path) -> None:
    sets = _sets(pipeline)
    annotated = make_annotated_dir(
        tmp_path / "annotated", videos=3, images=0, rejected=0, size=(32, 32), frames=(5, 6)
    )
    _invoke("shard", str(annotated), "-o", str(tmp_path / "shards"), *sets)
    _invoke("tokenize", str(tmp_path / "shards"), "-o", str(tmp_path / "latents"), *sets)
    run = tmp_path / "run"
    # no model.* or objective --set: the folder's transformer/config.json and its family give them
    sizes = [arg for s in [*SIZES, f"text_encoder.max_length={TEXT_LEN}"] for arg in ("--set", s)]
    _invoke(
        "train", "--data", str(tmp_path / "latents"), "--run-dir", str(run), "--init", str(pipeline), *sizes,
        "--set", "train.validate_every=0",  # a fine-tune's default validation: 10 s of Wan VAE decodes on CPU
    )  # fmt: skip
    assert load_profile(run / "export" / "profile.yaml").diffusion.objective == "flow"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and any(k.startswith("loss_t_") for k in metrics[-1])
    _invoke("infer", "-c", str(run), "--prompt", "a red square moving right", "-o", str(tmp_path / "out"))
    (video,) = sorted((tmp_path / "out").glob("*.mp4"))
    assert video.stat().st_size > 0
    # the download itself samples as published: its transformer, VAE and umT5, rectified flow with UniPC
    small = ["--set", "text_encoder.max_length=8", "--set", "infer.frames=5", "--set", "infer.height=32"]
    _invoke("infer", "-c", str(pipeline), "--prompt", "a blue circle", "-o", str(tmp_path / "as_published"),
            *small, "--set", "infer.width=32", "--set", "diffusion.steps=2")  # fmt: skip
    record = json.loads((tmp_path / "as_published" / "samples.jsonl").read_text())
    assert record["sampler"] == "unipc" and record["frames"] == 5
    # and so does its import, by the profile.yaml `model import` wrote
    _invoke("model", "import", str(pipeline), "-o", str(tmp_path / "imported"))
    _invoke("infer", "-c", str(tmp_path / "imported"), "--prompt", "a blue circle", "-o", str(tmp_path / "imp"),
            *small, "--set", "infer.width=32", "--set", "diffusion.steps=2")  # fmt: skip
    assert json.loads((tmp_path / "imp" / "samples.jsonl").read_text())["sampler"] == "unipc"
    # published weights predict the velocity: sampling them as x-prediction is refused in one line
    refused = CliRunner().invoke(
        app, ["infer", "-c", str(pipeline), "--prompt", "a", "-o", str(tmp_path / "no"),
              "--set", "diffusion.flow_prediction=clean"],
    )  # fmt: skip
    assert refused.exit_code != 0 and "predict the velocity" in refused.output
    # the trained export, back in diffusers' layout, computes what vidforge's export computes
    _invoke("model", "export", str(run / "export"), "--to", "diffusers", "-o", str(tmp_path / "diffusers"))
    from vidforge.families.wan.weights import load_diffusers_wan
    from vidforge.weights.checkpoint import load_model

    ours, theirs = load_model(run / "export"), load_diffusers_wan(tmp_path / "diffusers")
    x, text = torch.randn(1, 4, 2, 4, 4), torch.randn(1, 3, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, torch.tensor([0.3]), text), theirs(x, torch.tensor([0.3]), text))
    # README's few-step distillation with the download as the teacher (--init: the student's shape and
    # weights, and the teacher by default): one DMD2 step, infer samples the student in its two steps (no
    # guidance branch) without flags, and it goes back to diffusers
    student = tmp_path / "student"
    _invoke(
        "train", "--data", str(tmp_path / "latents"), "--run-dir", str(student), "--init", str(pipeline),
        *sizes, "--set", "train.distill.steps=2", "--set", "train.distill.fake_updates=1",
        "--set", "train.steps=1", "--set", "train.validate_every=0",
    )  # fmt: skip
    _invoke("infer", "-c", str(student), "--prompt", "a red square", "-o", str(tmp_path / "student_out"))
    record = json.loads((tmp_path / "student_out" / "samples.jsonl").read_text())
    assert (record["sampler"], record["model_calls"]) == ("few-step", 2)
    _invoke(
        "model", "export", str(student / "export"), "--to", "diffusers", "-o", str(tmp_path / "student_hf")
    )
    ours, theirs = load_model(student / "export"), load_diffusers_wan(tmp_path / "student_hf")
    with torch.no_grad():
        torch.testing.assert_close(ours(x, torch.tensor([0.3]), text), theirs(x, torch.tensor([0.3]), text))
    # an x-prediction model would sample noise in diffusers' pipelines, which read a velocity: refused
    import shutil

    clean = shutil.copytree(run / "export", tmp_path / "clean_export")
    profile = (clean / "profile.yaml").read_text()
    (clean / "profile.yaml").write_text(
        profile.replace("flow_prediction: velocity", "flow_prediction: clean")
    )
    refused = CliRunner().invoke(
        app, ["model", "export", str(clean), "--to", "diffusers", "-o", str(tmp_path / "x")]
    )
    assert refused.exit_code != 0 and "flow_prediction=clean" in refused.output
