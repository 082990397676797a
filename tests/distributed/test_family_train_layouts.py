"""`vidforge train` of HunyuanVideo-1.5 (image-to-video: condition latents and image tokens) and of LTX-2's
video path under context parallel with FSDP2 over the cp ranks, under FSDP2 data parallel, and under
tensor parallel (the families' plans, `families/*/tensor_parallel.py`, without sequence parallel: this
clip's 45 tokens do not split evenly), against one process: the same data, the same initial weights and
the same noise, so each step's loss and the exported weights must agree; what differs is how the model, its tokens and its gradients are split.
Every sample is the same clip (one a shard), so data-parallel ranks see what the single process sees.
fp32 on CPU: relative 1e-4 over 3 AdamW steps covers reduction-order differences (as
test_train_layouts.py); a wrong gradient moves the third loss by far more.

The module-level float64 checks of the same networks (output, loss share, every gradient, at 1e-10) are
test_family_cp.py's. Runs `vidforge.train.loop.run` in gloo processes (tests/distributed/ranks.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ranks import run_ranks  # noqa: E402
from train_fixtures import losses  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

ROOT = Path(__file__).resolve().parents[2]
LATENT = (3, 3, 5)  # latent frames, height, width: 45 tokens, odd, so a cp=2 rank holds a pad
CAPTION = 9  # caption positions (the last 3 padding)

MODELS = {
    "hunyuan15": {
        "family": "hunyuan15", "layers": 2, "hidden": 32, "heads": 2, "mlp_hidden": 80, "refiner_layers": 1,
        "in_channels": 4, "condition_channels": 5, "text_dim": 24, "text_2_dim": 12, "text_2_tokens": 3,
        "image_dim": 20, "rope_axes": [4, 6, 6], "task": "i2v",
    },
    "ltx2": {
        "family": "ltx2", "layers": 2, "hidden": 48, "heads": 2, "mlp_hidden": 192, "in_channels": 8,
        "text_dim": 16, "rope_type": "split", "gated_attention": True,
    },
}  # fmt: skip
STEPS = {
    "data": {"packing": False, "batch_size": 1, "val_fraction": 0.0, "shuffle_buffer": 4, "prefetch": 0},
    "diffusion": {"objective": "flow", "caption_dropout": 0.0},
    "train": {
        "steps": 3, "precision": "fp32", "warmup_steps": 1, "lr": 1e-3, "ema_decay": 0.0, "log_every": 1,
        "save_every": 3, "validate_every": 0,
    },
}  # fmt: skip

# name -> (family, ranks, parallel section)
LAYOUTS = {
    "hunyuan15-cp2-ulysses": ("hunyuan15", 2, {"cp": 2, "cp_impl": "ulysses"}),
    "ltx2-cp2-ring": ("ltx2", 2, {"cp": 2, "cp_impl": "ring"}),
}
if os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") == "1":
    LAYOUTS |= {
        "hunyuan15-cp2-all-gather": ("hunyuan15", 2, {"cp": 2, "cp_impl": "all-gather"}),
        "hunyuan15-fsdp2": ("hunyuan15", 2, {"dp_shard": 2}),
        "hunyuan15-cp2-ring": ("hunyuan15", 2, {"cp": 2, "cp_impl": "ring"}),
        "hunyuan15-cp4-usp": ("hunyuan15", 4, {"cp": 4, "cp_impl": "usp", "cp_ulysses": 2}),
        "ltx2-cp2-ulysses": ("ltx2", 2, {"cp": 2, "cp_impl": "ulysses"}),
        "ltx2-fsdp2": ("ltx2", 2, {"dp_shard": 2}),
        "hunyuan15-tp2": ("hunyuan15", 2, {"tp": 2}),  # sequence parallel left to the family: off
        "ltx2-tp2": ("ltx2", 2, {"tp": 2, "sequence_parallel": False}),
    }


def _profile(family: str, world: int, parallel: dict):
    """The default profile with the family's tiny model and the settings above."""
    from vidforge.profile.loading import validate_profile

    data = yaml.safe_load((ROOT / "profiles" / "local_cpu.yaml").read_text())
    data["model"] = dict(MODELS[family])
    for section, values in STEPS.items():
        data[section] = {**data.get(section, {}), **values}
    data["cluster"]["cpu_processes"] = world
    data["parallel"] = {"dp_shard": -1, **parallel}
    return validate_profile(data)


def _latents(root: Path, family: str) -> Path:
    """Four identical samples, one a shard, in `vidforge tokenize`'s layout (with condition latents and an
    image embedding for an image-to-video model)."""
    from vidforge.data.shard_index import write_index
    from vidforge.data.shard_writer import ShardWriter, json_bytes, npy_bytes

    model = MODELS[family]
    rng = np.random.default_rng(0)
    mask = np.arange(CAPTION) < CAPTION - 3
    sample = {
        "latent.npy": npy_bytes(rng.standard_normal((model["in_channels"], *LATENT)).astype(np.float32)),
        "text_emb.npy": npy_bytes((rng.standard_normal((CAPTION, model["text_dim"])) * mask[:, None]).astype(np.float16)),
        "text_mask.npy": npy_bytes(mask),
        "txt": b"a caption",
    }  # fmt: skip
    if model.get("condition_channels"):
        condition = rng.standard_normal((model["condition_channels"], *LATENT)).astype(np.float32)
        sample["condition.npy"] = npy_bytes(condition)
        sample["image_emb.npy"] = npy_bytes(rng.standard_normal((9, model["image_dim"])).astype(np.float16))
    entries = []
    for i in range(4):
        key = f"s{i:06d}"
        with ShardWriter(root / f"train-{i:06d}.tar") as writer:
            meta = {"key": key, "number": i, "latent_shape": [model["in_channels"], *LATENT]}
            writer.add(key, {**sample, "json": json_bytes(meta)})
            entries.append({**writer.close(), "split": "train", "bucket": "all"})
    write_index(root, "latent", entries, created_by="tests/distributed/test_family_train_layouts.py")
    return root


def _train(rank: int, world: int, family: str, latents: str, run_dir: str, parallel: dict) -> None:
    from vidforge.train import loop

    loop.run(_profile(family, world, parallel), [latents], run_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """reference(family) -> (latents, the single-process run directory), each run once per module."""
    root = tmp_path_factory.mktemp("family_layouts")
    runs: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in runs:
            latents = _latents(root / f"{family}-latents", family)
            run_ranks(_train, 1, family, str(latents), str(root / f"{family}-single"), {})
            runs[family] = (latents, root / f"{family}-single")
        return runs[family]

    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_family_layout_matches_one_process(name, reference, tmp_path) -> None:
    from vidforge.weights.checkpoint import load_model

    family, ranks, parallel = LAYOUTS[name]
    latents, single_dir = reference(family)
    run_ranks(_train, ranks, family, str(latents), str(tmp_path / name), parallel)
    single, got = losses(single_dir), losses(tmp_path / name)
    assert len(got) == len(single) == 3
    assert got == pytest.approx(single, rel=1e-4, abs=1e-6)
    assert len(set(single)) > 1  # training moved the weights: later losses differ
    ours, theirs = load_model(tmp_path / name / "export"), load_model(single_dir / "export")
    mine = dict(ours.named_parameters())
    assert mine.keys() == dict(theirs.named_parameters()).keys()
    for key, value in theirs.named_parameters():
        torch.testing.assert_close(mine[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize(
    "parallel",
    [
        {"cp": 2, "cp_impl": "ring"},
        {"cp": 4, "cp_impl": "usp", "cp_ulysses": 2},
        {"cp": 2, "cp_impl": "ulysses"},
    ],
)
def test_joint_attention_loads_under_every_full_attention_cp(parallel) -> None:
    """HunyuanVideo-1.5's joint attention runs under all-gather, ring, ulysses and usp (the caption's keys
    once in every softmax: `parallel.joint_attention`)."""
    assert _profile("hunyuan15", parallel["cp"], parallel).parallel.cp_impl == parallel["cp_impl"]


def test_joint_attention_refuses_regather() -> None:
    """What HunyuanVideo-1.5's joint attention has no code for under context parallel: refused at load, in
    one line."""
    from vidforge.profile import ProfileError

    with pytest.raises(ProfileError, match="parallel.cp_regather: .*set parallel.cp_regather=false") as err:
        _profile("hunyuan15", 2, {"cp": 2, "cp_impl": "all-gather", "cp_regather": True})
    assert "\n" not in str(err.value)


def test_tensor_parallel_refuses_sequence_parallel_at_load_for_hunyuan15() -> None:
    """HunyuanVideo-1.5's tensor-parallel plan has no sequence parallel: asking for it is refused when the
    profile loads, in one line naming the fix; left unset, tp=2 loads without it, and LTX-2 with it."""
    from vidforge.profile import ProfileError
    from vidforge.profile.layout_rules import sequence_parallel

    says = "parallel.sequence_parallel: .*set parallel.sequence_parallel=false or leave it unset"
    with pytest.raises(ProfileError, match=says) as err:
        _profile("hunyuan15", 2, {"tp": 2, "sequence_parallel": True})
    assert "\n" not in str(err.value)
    assert not sequence_parallel(_profile("hunyuan15", 2, {"tp": 2}))
    assert sequence_parallel(_profile("ltx2", 2, {"tp": 2}))
