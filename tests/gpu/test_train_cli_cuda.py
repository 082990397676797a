"""`vidforge train` and `vidforge infer` end to end on the device, as a launched rank runs them
(LOCAL_RANK picks the device), against the same run on the CPU: fp32 losses and the exported EMA
weights; activation checkpointing and offload, which must not change the losses; bf16 + torch.compile
and FP8 against fp32 within their precision; a resume from the DCP checkpoint against the run that went
straight through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS, losses, make_latents  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # 25-90 s each on an H200: the suite starts them first

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def latents(tmp_path_factory) -> Path:
    return make_latents(tmp_path_factory.mktemp("data"))


def _sets(device: torch.device, extra: tuple[str, ...]) -> list[str]:
    on = ["cluster.accelerator=h100", "cluster.gpus_per_node=1"] if device.type == "cuda" else []
    args = []
    for item in (*TRAIN_SETS, *on, *extra):
        args += ["--set", item]
    return args


def vidforge(*args: str) -> dict:
    env = {**os.environ, "LOCAL_RANK": "0"}
    cmd = [sys.executable, "-m", "vidforge.cli.app", "--json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train(latents: Path, run: Path, device: torch.device, *extra: str, resume: bool = False) -> dict:
    args = ["train", "--data", str(latents), "--run-dir", str(run), *_sets(device, extra)]
    return vidforge(*args, *(["--resume"] if resume else []))


def export(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (weights,) = (run / "export").glob("*.safetensors")
    return load_file(weights)


def test_train_on_the_device_matches_the_cpu_and_infer_renders(latents, tmp_path, device):
    summary = train(latents, tmp_path / "dev", device)
    train(latents, tmp_path / "cpu", torch.device("cpu"))
    if device.type == "cuda":
        assert summary["peak_memory_gib"] > 0
    torch.testing.assert_close(losses(tmp_path / "dev"), losses(tmp_path / "cpu"), rtol=1e-3, atol=1e-4)
    ours, ref = export(tmp_path / "dev"), export(tmp_path / "cpu")  # the EMA weights
    assert ours.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-3, atol=1e-4, msg=name)

    out = tmp_path / "samples"
    vidforge("infer", "-c", str(tmp_path / "dev"), "--prompt", "a red square moving right", "-o", str(out))
    assert list(out.glob("*.mp4")) and (out / "samples.jsonl").exists()


def test_activation_checkpointing_and_offload_keep_the_losses(latents, tmp_path, device):
    train(latents, tmp_path / "plain", device)
    recompute = ("train.activation_checkpointing=selective", "train.activation_offload=0.5")
    train(latents, tmp_path / "recompute", device, *recompute)
    torch.testing.assert_close(
        losses(tmp_path / "recompute"), losses(tmp_path / "plain"), rtol=1e-5, atol=1e-6
    )


def test_resume_from_the_dcp_checkpoint_continues_the_same_run(latents, tmp_path, device):
    # a constant learning rate, so that the first run's shorter schedule does not change its 3 steps
    constant = "train.schedule=constant"
    train(latents, tmp_path / "straight", device, constant)  # 6 steps, checkpoints at 3 and 6
    train(latents, tmp_path / "split", device, constant, "train.steps=3")
    train(latents, tmp_path / "split", device, constant, resume=True)
    straight, split = losses(tmp_path / "straight"), losses(tmp_path / "split")
    torch.testing.assert_close(split[-3:], straight[-3:], rtol=1e-5, atol=1e-6)
    for name, value in export(tmp_path / "straight").items():
        torch.testing.assert_close(export(tmp_path / "split")[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("mode", ["bf16+compile", "fp8+compile"])
def test_bf16_compile_and_fp8_train_close_to_fp32(latents, tmp_path, device, mode):
    if device.type == "cpu":
        pytest.skip("bf16/compile/FP8 training are GPU paths (inductor's C++ build takes minutes on a CPU)")
    if mode.startswith("fp8"):
        if torch.cuda.get_device_capability(device) < (8, 9):
            pytest.skip("FP8 matmuls need compute capability >= 8.9")
        pytest.importorskip("torchao", reason="torchao (the `gpu` extra) is not installed")
    train(latents, tmp_path / "fp32", device)
    sets = [
        "train.precision=bf16",
        "train.compile=true",
        *(["train.fp8=true"] if mode.startswith("fp8") else []),
    ]
    train(latents, tmp_path / "fast", device, *sets)
    # the first step sees the same weights, data and noise: only the arithmetic's precision differs
    torch.testing.assert_close(
        losses(tmp_path / "fast")[0], losses(tmp_path / "fp32")[0], rtol=5e-2, atol=1e-3
    )
