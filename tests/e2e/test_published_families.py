"""Every published family, tried as a new user would, on the tiny random diffusers folder of each
(Wan2.1 T2V, Wan2.1-I2V, Wan2.2 T2V-A14B, Wan2.2 TI2V-5B, Wan2.2 I2V-A14B): `model import FOLDER -o X`
writes a profile that trains and samples the folder as published (flow, its VAE, its umT5); `shard` and
`tokenize` with that profile, then `train --profile X/profile.yaml` trains; the diffusers pipeline class
of the folder `.from_pretrained` loads the folder, and loads the folder with vidforge's export of the
import in place of its transformer(s), tensor for tensor.

`train --init FOLDER` (no model.* --set) and `infer -c FOLDER` run here for Wan2.2 I2V-A14B, the family no
other end-to-end test covers; for the others they are in tests/e2e/test_wan_pipeline.py (Wan2.1 T2V),
test_wan_i2v_pipeline.py (Wan2.1-I2V: --init, infer --image, infer -c FOLDER --lora),
test_wan22_expert_lora.py (T2V-A14B: --init of one expert, infer -c FOLDER and its import) and
test_wan22_ti2v_pipeline.py (TI2V-5B: --init, infer -c FOLDER, infer --image)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.testing import make_annotated_dir
from vidforge.profile import load_profile

pytest.importorskip("transformers")
from wan22_fixtures import save_tiny_wan22_pipeline  # noqa: E402
from wan22_i2v_fixtures import save_tiny_wan22_i2v_pipeline  # noqa: E402
from wan22_ti2v_fixtures import save_tiny_ti2v_pipeline  # noqa: E402
from wan_fixtures import save_tiny_wan_pipeline  # noqa: E402
from wan_i2v_fixtures import save_tiny_wan_i2v_pipeline  # noqa: E402


@dataclass(frozen=True)
class Family:
    save: object  # fn(root) -> the folder
    pipeline: str  # diffusers' pipeline class of the download
    size: int  # the clips' side: 4 latent tokens a side at the VAE's compression
    experts: bool = False
    image: bool = False  # the model reads condition channels: --image is needed


FAMILIES = {
    "wan2.1-t2v": Family(save_tiny_wan_pipeline, "WanPipeline", 32),
    "wan2.1-i2v": Family(save_tiny_wan_i2v_pipeline, "WanImageToVideoPipeline", 32, image=True),
    "wan2.2-t2v-a14b": Family(save_tiny_wan22_pipeline, "WanPipeline", 32, experts=True),
    "wan2.2-ti2v-5b": Family(save_tiny_ti2v_pipeline, "WanPipeline", 64),
    "wan2.2-i2v-a14b": Family(
        save_tiny_wan22_i2v_pipeline, "WanImageToVideoPipeline", 32, experts=True, image=True
    ),
}


def _sizes(size: int) -> list[str]:
    return [
        f"data.buckets=[[{size},{size}]]", "data.frame_buckets=[5]", "data.val_fraction=0",
        "data.token_budget=64", "text_encoder.max_length=8", "train.steps=2", "train.warmup_steps=1",
        "train.log_every=1", "train.precision=fp32", "train.save_every=2", "train.validate_every=0",
        "infer.frames=5", f"infer.height={size}", f"infer.width={size}", "diffusion.steps=2",
    ]  # fmt: skip


def _sets(items: list[str]) -> list[str]:
    return [arg for s in items for arg in ("--set", s)]


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.stdout[-2000:], result.stderr[-2000:])
    return result.output


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_new_user_imports_trains_and_exports_each_published_family(name, tmp_path) -> None:
    import diffusers

    family = FAMILIES[name]
    folder = family.save(tmp_path / f"{name}-tiny-Diffusers").resolve()
    imported = tmp_path / "imported"
    _invoke("model", "import", str(folder), "-o", str(imported))
    profile_path = str(imported / "profile.yaml")
    profile = load_profile(profile_path)
    assert (profile.diffusion.objective, profile.diffusion.flow_prediction) == ("flow", "velocity")
    assert (profile.tokenizer.kind, Path(profile.tokenizer.path)) == ("wan", folder / "vae")
    assert (profile.text_encoder.kind, Path(profile.text_encoder.path)) == ("t5", folder / "text_encoder")
    assert (profile.model.experts == 2) == family.experts
    assert (profile.model.condition_channels > 0) == family.image

    # the profile the import wrote shards with the folder's umT5, tokenizes with its VAE and trains
    sizes = _sizes(family.size)
    annotated = make_annotated_dir(
        tmp_path / "annotated", videos=2, images=0, rejected=0, size=(family.size,) * 2, frames=(5, 6)
    )
    _invoke("shard", str(annotated), "-o", str(tmp_path / "shards"), "-p", profile_path, *_sets(sizes))
    _invoke("tokenize", str(tmp_path / "shards"), "-o", str(tmp_path / "latents"), "-p", profile_path,
            *_sets(sizes))  # fmt: skip
    index = json.loads((tmp_path / "latents" / "index.json").read_text())
    assert Path(index["tokenizer"]["source"]) == folder / "vae"
    run = tmp_path / "run"
    expert = ["train.expert=high"] if family.experts else []
    _invoke("train", "--profile", profile_path, "--data", str(tmp_path / "latents"), "--run-dir", str(run),
            *_sets([*sizes, *expert]))  # fmt: skip
    assert len(losses := _losses(run)) == 2 and all(np.isfinite(losses))
    trained = load_profile(run / "export" / "profile.yaml")
    assert (trained.diffusion.objective, trained.tokenizer.kind, trained.text_encoder.kind) == (
        "flow",
        "wan",
        "t5",
    )

    # the pipeline class loads the folder, and the folder with the import exported in its place
    pipeline = getattr(diffusers, family.pipeline)
    source = pipeline.from_pretrained(folder)
    copy = Path(shutil.copytree(folder, tmp_path / "exported", ignore=shutil.ignore_patterns("transformer*")))
    parts = {"transformer": imported}
    if family.experts:
        parts["transformer_2"] = imported / "low_noise"
    for part, export in parts.items():
        _invoke("model", "export", str(export), "--to", "diffusers", "-o", str(copy / part))
        assert _tensors(copy / part).keys() == _tensors(folder / part).keys()
    loaded = pipeline.from_pretrained(copy)
    for part in parts:
        theirs = getattr(source, part).state_dict()
        assert all(torch.equal(t, theirs[n]) for n, t in getattr(loaded, part).state_dict().items())


@pytest.mark.slow
def test_wan22_i2v_a14b_trains_an_expert_from_the_folder_and_samples_from_an_image(tmp_path) -> None:
    """The cells of the new-user path the other end-to-end tests hold for the other families: `train
    --init FOLDER` of one expert with no model.* --set, on clips tokenized with the folder's profile (each
    with its condition latents: training refuses data without them), in full and as README's LoRA, and
    `infer -c` from a first frame of the folder, of the full run beside the folder's other expert, and
    of the folder with the adapter on its expert."""
    from PIL import Image

    family = FAMILIES["wan2.2-i2v-a14b"]
    folder = family.save(tmp_path / "Wan2.2-I2V-A14B-tiny-Diffusers").resolve()
    sizes = _sizes(family.size)
    _invoke("model", "import", str(folder), "-o", str(tmp_path / "imported"))
    profile_path = str(tmp_path / "imported" / "profile.yaml")
    annotated = make_annotated_dir(
        tmp_path / "annotated", videos=2, images=0, rejected=0, size=(32, 32), frames=(5, 6)
    )
    _invoke("shard", str(annotated), "-o", str(tmp_path / "shards"), "-p", profile_path, *_sets(sizes))
    _invoke("tokenize", str(tmp_path / "shards"), "-o", str(tmp_path / "latents"), "-p", profile_path,
            *_sets(sizes))  # fmt: skip
    run = tmp_path / "run"
    _invoke("train", "--data", str(tmp_path / "latents"), "--run-dir", str(run), "--init", str(folder),
            *_sets([*sizes, "train.expert=low", "train.steps=1", "train.save_every=1"]))  # fmt: skip
    assert len(_losses(run)) == 1
    lora = tmp_path / "lora"
    _invoke("train", "--data", str(tmp_path / "latents"), "--run-dir", str(lora), "--init", str(folder),
            *_sets([*sizes, "train.expert=low", "train.steps=1", "train.save_every=1", "train.lora.rank=4",
                    "train.lora.alpha=4"]))  # fmt: skip
    image = tmp_path / "first.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(image)
    with_lora = (str(folder), "--lora", str(lora))
    for source, out in (((str(folder),), "as_published"), ((str(run),), "trained"), (with_lora, "lora")):
        _invoke("infer", "-c", *source, "--prompt", "a red square", "--image", str(image),
                "-o", str(tmp_path / out), *_sets(sizes))  # fmt: skip
        record = json.loads((tmp_path / out / "samples.jsonl").read_text())
        assert (record["guidance"], record["guidance_2"], record["frames"]) == (3.5, 3.5, 5)
        assert (tmp_path / out / record["video"]).stat().st_size > 0
    refused = CliRunner().invoke(
        app, ["infer", "-c", str(folder), "--prompt", "a", "-o", str(tmp_path / "no"), *_sets(sizes)]
    )
    assert refused.exit_code == 2 and "give the first frame to animate with --image PATH" in refused.output
