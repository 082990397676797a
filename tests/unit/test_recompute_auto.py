"""`train.activation_checkpointing: auto` and op-level recompute (issue #48, item 1): which blocks recompute
what (`block_policies`), auto's choice against a brute-force search over every mix on the memory model,
the training losses and weights of op-level and mixed recompute equal to full recompute's (same seed), and
the memory model's prediction per policy against what a real step holds on the CPU (saved-tensor hooks, as
tests/unit/test_bench_memory.py; what op-level checkpointing caches goes through the same hooks)."""

from __future__ import annotations

import pytest
import torch
from test_bench_memory import TINY, WAN

from vidforge.bench.train_bench import BenchStep
from vidforge.errors import UserInputError
from vidforge.estimate.memory_model import estimate_memory
from vidforge.estimate.recompute import choose_recompute, resolve_auto, with_mix
from vidforge.memory_savers.activation_checkpoint import OPS_RECOMPUTE_COST, block_policies
from vidforge.profile import load_profile

OPS = ["train.activation_checkpointing=selective", "train.checkpoint_ratio=0", "train.checkpoint_ops_ratio=1"]
MIX = [
    "train.activation_checkpointing=selective",
    "train.checkpoint_ratio=0.25",
    "train.checkpoint_ops_ratio=0.5",
    "model.layers=4",
]


def test_selective_spreads_full_then_op_level_blocks() -> None:
    assert block_policies(4, "selective", 0.25, 0.5) == ["full", "ops", "ops", "none"]
    assert block_policies(6, "selective", 0.5, 0.5) == ["full", "ops", "full", "ops", "full", "ops"]
    assert block_policies(3, "full", 0.0) == ["full"] * 3
    assert block_policies(3, "selective", 0.0, 1.0) == ["ops"] * 3
    with pytest.raises(UserInputError, match="auto"):
        block_policies(3, "auto", 0.0)


def test_ratios_beyond_every_block_are_refused() -> None:
    with pytest.raises(Exception, match="checkpoint_ops_ratio"):
        load_profile(None, [*TINY, *MIX, "train.checkpoint_ratio=0.75"])


def _brute_force(profile, capacity: float) -> tuple[float, int, int] | None:
    """Every mix of full, op-level and kept blocks on the memory model: the cheapest that fits."""
    n = profile.model.layers
    fits = [
        (f + OPS_RECOMPUTE_COST * o, f, o)
        for f in range(n + 1)
        for o in range(n - f + 1)
        if estimate_memory(with_mix(profile, n, f, o)).total <= capacity
    ]
    return min(fits) if fits else None


def test_auto_takes_the_least_recompute_that_fits() -> None:
    """Cards that fit every block kept, about only full recompute, nothing, and everything between: auto's
    pick is the brute force's (least cost), and fits."""
    profile = load_profile(None, [*TINY, *WAN, "model.layers=6", "train.activation_checkpointing=auto"])
    n = profile.model.layers
    none, full = (estimate_memory(with_mix(profile, n, f, 0)).total for f in (0, n))
    every = choose_recompute(profile, capacity_bytes=none)
    assert (every.full, every.ops, every.none, every.fits) == (0, 0, n, True)
    # where the blocks' saved tensors are below the gradients the backward frees them into, trading a
    # full block for an op-level one costs no memory at the peak: that mix is cheaper than all-full
    only_full = choose_recompute(profile, capacity_bytes=full)
    assert (only_full.cost, only_full.full, only_full.ops) == pytest.approx(_brute_force(profile, full))
    assert only_full.fits and only_full.full >= n - 1
    nothing = choose_recompute(profile, capacity_bytes=full - 1)
    assert (nothing.full, nothing.fits) == (n, False)
    for share in (0.1, 0.3, 0.5, 0.7, 0.9):
        capacity = full + share * (none - full)
        choice = choose_recompute(profile, capacity_bytes=capacity)
        assert (choice.cost, choice.full, choice.ops) == pytest.approx(_brute_force(profile, capacity))
        assert choice.fits and choice.predicted_bytes <= capacity
        assert choice.full + choice.ops > 0 and choice.full < n  # some recompute, not all in full


def test_auto_is_resolved_into_the_profile_with_its_choice() -> None:
    profile = load_profile(None, [*TINY, *WAN, "model.layers=4", "train.activation_checkpointing=auto"])
    resolved, choice = resolve_auto(profile)
    assert choice is not None and "auto recompute" in choice.describe()
    assert resolved.train.activation_checkpointing in ("none", "full", "selective")
    same, none = resolve_auto(resolved)
    assert same is resolved and none is None


def _train(sets: list[str], steps: int = 2) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    step = BenchStep(load_profile(None, [*TINY, *WAN, "model.layers=4", *sets]))
    losses = []
    for _ in range(steps):
        losses.append(step.step(step.batches).loss)
        step.step.apply()
    weights = {k: v.detach().clone() for k, v in step.parts.modules[0].state_dict().items()}
    return losses, weights


def test_op_level_and_mixed_recompute_train_as_full_recompute_does() -> None:
    """Same seed, two steps: the losses and the weights after them equal full recompute's (recompute
    changes what is kept, not what is computed)."""
    full_losses, full_weights = _train(["train.activation_checkpointing=full"])
    for sets in (OPS, MIX):
        losses, weights = _train(sets)
        assert losses == pytest.approx(full_losses, rel=1e-6), sets
        assert weights.keys() == full_weights.keys()
        for name, value in full_weights.items():
            torch.testing.assert_close(weights[name], value, msg=name)


def _measured_and_predicted(sets: list[str]) -> tuple[int, float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profile = load_profile(None, [*TINY, *sets])
        step = BenchStep(profile)
        measured = step.measure_memory()["activations"]
    finally:
        torch.set_num_threads(threads)
    est = estimate_memory(step.profile, step.dims.layout, step.workload)
    return measured, est.get("activations") + est.get("weight copies")


@pytest.mark.parametrize(
    "sets",
    [
        [*OPS, "model.layers=1"],
        [*OPS, "train.micro_batch=2"],
        [*OPS, "model.architecture=stdit", "model.layers=1"],
        [*MIX, "data.packing=false", "train.micro_batch=2"],
        [*WAN, *OPS],
        [*WAN, *MIX],
        [*WAN, *OPS, "train.lora={rank: 4}", "train.precision=bf16"],
        [
            *WAN,
            "model.layers=4",
            "train.activation_checkpointing=auto",
            "cluster.accelerator.memory_gib=0.0128",
        ],
    ],
    ids=[
        "dit-ops",
        "dit-ops-batch2",
        "stdit-ops",
        "dit-mixed-plain-batch2",
        "wan-ops",
        "wan-mixed",
        "wan-ops-lora-bf16",
        "wan-auto",
    ],
)
def test_memory_model_per_policy_matches_the_measured_step(sets: list[str]) -> None:
    measured, predicted = _measured_and_predicted(sets)
    assert predicted == pytest.approx(measured, rel=0.05)
