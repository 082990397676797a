"""LoRA under FSDP2 with the swapped blocks' shards in host memory (`train.lora.blocks_to_swap` on two
ranks), and with every shard there (`train.fsdp_cpu_offload`), against one process without either, each
through `vidforge train`'s own build and step (`BenchStep`, the same synthetic batch on every rank, so one
process sees what the two ranks see), with the float8 base and full recompute.

On the CPU the host and the device are one memory, so where a shard lives changes no value: swap (2 of 4
blocks' shards on the host) and offload (all 4) give the same losses bit for bit (the same reduce-scatters
and AdamW steps). One process differs from FSDP2 by the order its gradients are summed in: the losses to
rel 1e-4, as every layout's test (tests/distributed/test_train_layouts.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SETS = (
    "model.preset=wan2.1-1.3b",
    "model.layers=4",
    "model.abs_position=none",
    "model.hidden=64",
    "model.heads=4",
    "model.mlp_hidden=128",
    "model.text_dim=32",
    "bench.latent_frames=2",
    "bench.latent_height=8",
    "bench.latent_width=8",
    "bench.text_tokens=8",
    "train.warmup_steps=0",
    "train.lr=1e-2",
    "train.lora={rank: 4, alpha: 8, fp8_base: true}",
    "train.activation_checkpointing=full",
    "cluster.accelerator.kind=cpu",
)
SWAP = 2
RUNS = {  # name -> its settings on two ranks
    "swap": ("parallel.dp_shard=-1", f"train.lora.blocks_to_swap={SWAP}"),
    "offload": ("parallel.dp_shard=-1", "train.fsdp_cpu_offload=true"),
}
STEPS = 3


def _losses(sets: tuple[str, ...]) -> tuple[list[float], list[bool]]:
    """Three steps' losses, and which blocks hold their shards in host memory."""
    import torch

    from vidforge.bench.train_bench import BenchStep
    from vidforge.parallel.fsdp import on_host
    from vidforge.profile import load_profile

    torch.manual_seed(0)
    bench = BenchStep(load_profile(None, [*SETS, *sets]))
    out = []
    for _ in range(STEPS):
        out.append(bench.step(bench.batches).loss)
        bench.step.apply()
    return out, [on_host(b) for b in bench.parts.modules[0].blocks.values()]


def _ranks(rank: int, world: int) -> dict[str, tuple[list[float], list[bool]]]:
    return {name: _losses((*sets, f"cluster.cpu_processes={world}")) for name, sets in RUNS.items()}


def test_swap_and_cpu_offload_under_fsdp2_match_one_process() -> None:
    one, _ = _losses(())
    assert len(set(one)) == STEPS  # the adapters move
    for rank in run_ranks(_ranks, 2):
        (swap, swapped), (offload, offloaded) = rank["swap"], rank["offload"]
        # block swap keeps the last SWAP blocks' shards on the host; the offload every block's
        assert swapped == [False] * (4 - SWAP) + [True] * SWAP and offloaded == [True] * 4
        assert swap == pytest.approx(one, rel=1e-4)
        assert offload == swap
