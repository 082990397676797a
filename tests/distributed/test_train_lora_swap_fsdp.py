"""LoRA under FSDP2 with the swapped blocks' shards in host memory (`train.lora.blocks_to_swap` on two
ranks), and with every shard there (`train.fsdp_cpu_offload`), against one process without either, each
through `vidforge train`'s own build and step (`BenchStep`, the same synthetic batch on every rank, so one
process sees what the two ranks see), with the float8 base and full recompute.

On the CPU the host and the device are one memory, so where a shard lives changes no value: swap (2 of 4
blocks' shards on the host) and offload (all 4) give the same losses bit for bit (the same reduce-scatters
and AdamW steps). One process differs from FSDP2 by the order its gradients are summed in: the losses to
rel 1e-4, as every layout's test (tests/distributed/test_train_layouts.py). FSDP2's profiler ranges show
the schedule: each swapped block gathered one block ahead, in the backward in reverse order."""

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


def _losses(sets: tuple[str, ...]) -> tuple[list[float], list[bool], list[str]]:
    """Three steps' losses, which blocks hold their shards in host memory, and the order of FSDP2's
    block gathers in the last step (its profiler ranges: "pre_forward (blocks.1)", "forward_prefetch for
    blocks.2", ...)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vidforge.bench.train_bench import BenchStep
    from vidforge.parallel.fsdp import on_host
    from vidforge.profile import load_profile

    torch.manual_seed(0)
    bench = BenchStep(load_profile(None, [*SETS, *sets]))
    out = []

    def step() -> None:
        out.append(bench.step(bench.batches).loss)
        bench.step.apply()

    for _ in range(STEPS - 1):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    gathers = [
        e.name.removeprefix("FSDP::") for e in events if e.name.startswith("FSDP::") and "blocks." in e.name
    ]
    blocks = bench.parts.modules[0].blocks.values()
    # what FSDP2 itself was told (its private state; the product asks `on_host`, apply_fsdp's record)
    assert [on_host(b) for b in blocks] == [_fsdp2_offloads(b) for b in blocks]
    return out, [on_host(b) for b in blocks], gathers


def _fsdp2_offloads(module) -> bool:
    """Whether FSDP2 holds `module`'s parameter group under a CPUOffloadPolicy."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    state = fully_shard.state(module) if hasattr(module, "_get_fsdp_state") else None
    group = getattr(state, "_fsdp_param_group", None)  # FSDP2 keeps the policy on the module's group only
    return group is not None and isinstance(group.offload_policy, CPUOffloadPolicy)


def _ranks(rank: int, world: int) -> dict[str, tuple[list[float], list[bool], list[str]]]:
    return {name: _losses((*sets, f"cluster.cpu_processes={world}")) for name, sets in RUNS.items()}


def test_swap_and_cpu_offload_under_fsdp2_match_one_process() -> None:
    one, _, _ = _losses(())
    assert len(set(one)) == STEPS  # the adapters move
    for rank in run_ranks(_ranks, 2):
        (swap, swapped, gathers), (offload, offloaded, _) = rank["swap"], rank["offload"]
        # block swap keeps the last SWAP blocks' shards on the host; the offload every block's
        assert swapped == [False] * (4 - SWAP) + [True] * SWAP and offloaded == [True] * 4
        assert swap == pytest.approx(one, rel=1e-4)
        assert offload == swap
        # one block ahead: a swapped block's gather starts while the block before it runs forward, and
        # (backward, reverse order) while the block after it runs backward
        for i in range(4 - SWAP, 4):
            assert _between(gathers, f"forward_prefetch for blocks.{i}", f"blocks.{i - 1}", "forward")
            if i < 3:
                assert _between(gathers, f"backward_prefetch for blocks.{i}", f"blocks.{i + 1}", "backward")


def _between(events: list[str], event: str, block: str, direction: str) -> bool:
    """Whether `event` happens inside `block`'s forward (pre_forward .. post_forward) or backward
    (pre_backward .. its gradients' reduce-scatter)."""
    start = events.index(f"pre_{direction} ({block})")
    end = events.index(
        f"post_forward ({block})" if direction == "forward" else f"post_backward_reduce ({block})"
    )
    return start < events.index(event) < end
