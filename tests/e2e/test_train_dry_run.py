"""`vidforge train --dry-run`: a 32-node x 8-GPU profile's 3D layout built on a fake process group in one
CPU process, with per-rank memory; and the counted parameter shards checked against the whole model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vidforge.estimate.memory_model import estimate_memory
from vidforge.models import build_model
from vidforge.profile import load_profile
from vidforge.train.dry_run import dry_run


def test_dry_run_of_a_256_gpu_profile_prints_per_rank_memory() -> None:
    exe = Path(sys.executable).with_name("vidforge")
    proc = subprocess.run(
        [str(exe), "--json", "train", "--dry-run", "--profile", "dit28b_74k_tp4_cp8_256xh100"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["world_size"] == 32 * 8 and result["layout"] == "DP_SHARD8xCP8xTP4"
    (stage,) = result["stages"]
    assert stage["blocks"] == list(range(48))
    # 28B parameters over tp4 x FSDP 64 (dp_shard8 x cp8) is 110M a rank; conditioning stays whole on tp ranks
    assert 100e6 < stage["parameters"] < 130e6
    # the analytic model of `bench plan` agrees with what the layout built, to its stated 15%
    assert stage["model_parameter_bytes"] == pytest.approx(stage["parameter_bytes"], rel=0.15)
    parts = ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "ema_bytes")
    assert stage["total_bytes"] == pytest.approx(
        sum(stage[k] for k in parts) + sum(stage["model_terms"].values())
    )
    assert stage["activation_bytes"] == stage["model_terms"]["activations"] > 0
    # one memory model: the plan's total and the dry run's differ by FSDP's padding of uneven shards only
    plan = estimate_memory(load_profile("dit28b_74k_tp4_cp8_256xh100"))
    assert stage["total_bytes"] == pytest.approx(plan.total, rel=0.01)


def test_dry_run_shards_add_up_to_the_whole_model() -> None:
    # pp2 x dp_shard4: each stage's FSDP shards, times 4, give its blocks plus the conditioning modules
    # that every stage keeps; over both stages that is the whole model plus one more copy of them.
    profile = load_profile(
        "local_cpu",
        ["cluster.cpu_processes=8", "parallel.pp=2", "parallel.dp_shard=4", "model.layers=4"],
    )
    result = dry_run(profile)
    model = build_model(profile.model, device="meta")
    total = sum(p.numel() for p in model.parameters())
    per_stage = ("blocks.", "patch_embed.", "final.")
    shared = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(per_stage))
    counted = sum(stage.parameters * 4 for stage in result.stages)
    # FSDP pads each parameter's first dimension to a multiple of 4 on the first ranks: a little over
    assert total + shared <= counted <= (total + shared) * 1.02
    assert [s.blocks for s in result.stages] == [[0, 1], [2, 3]]
