"""LoRA (`train.lora`) under FSDP2, and under context parallel, against one process: the frozen base (bf16) and its fp32 adapters share
each block's FSDP unit (fully_shard needs one dtype among a unit's trainable parameters only, and its
param_dtype casts every parameter to bf16 for the all-gather), the gradients and AdamW states exist for the
adapters alone. Same data on both ranks (tests/distributed/test_train_layouts.py's reference), so the
losses and the exported adapter must be one process's.

fp32 runs by default (losses to rel 1e-4, as every layout's test). bf16, where the base is bf16 and the
adapters fp32 in one FSDP unit, runs with VIDFORGE_TEST_ALL_LAYOUTS=1 to the same tolerances: FSDP2 casts no
forward inputs and its forward runs under one process's autocast (`parallel.fsdp.apply_fsdp`), so both
round alike (measured bitwise equal; while FSDP2 cast the blocks' inputs to bf16 the losses were 0.5% and
the adapters up to 16% in mean apart). The one-process reference runs in the test's
own process (no spawn); the pair took ~28 s on a loaded 2-core machine. LoRA with the float8 base under
context parallel (cp=2, ring; FSDP2 sharding over the cp ranks) runs by default; FSDP2 alone, bf16, and
the float8 base under FSDP2 on two and on four ranks (and with block swap on four), block swap under FSDP2 and FSDP2's CPU offload with
VIDFORGE_TEST_ALL_LAYOUTS=1 (tests/distributed/test_train_lora_swap_fsdp.py runs those two by default, on
`BenchStep`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ranks import run_ranks  # noqa: E402
from train_fixtures import WAN, losses, make_latents, train_profile  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SETS = (
    *WAN,
    "model.heads=4",
    "train.steps=3",
    "train.lora={rank: 4, alpha: 8}",
    "train.lr=1e-2",
    "train.ema_decay=0",
    "data.token_budget=432",
)
# precision -> (the losses' relative tolerance, the adapters' mean difference relative to their mean size)
TOLERANCES = {"fp32": (1e-4, 1e-3), "bf16": (1e-4, 1e-3)}
FSDP = ("parallel.dp_shard=-1",)
# context parallel (ring) over the two ranks, FSDP2 sharding the weights over cp: each rank holds half of
# every clip's tokens, the adapters' gradients all-reduced over both
CP2 = ("parallel.cp=2", "parallel.cp_impl=ring", "parallel.dp_shard=1")
# the float8 base (train.lora.fp8_base): its uint8 weights sharded and gathered as they are, its scales
# whole on every rank; fp32 compute, so one process's losses again
FP8 = ("train.lora.fp8_base=true",)
# name -> (ranks, precision, settings)
# by default one pair: context parallel shards the weights with FSDP2 over its two ranks too
CASES: dict[str, tuple[int, str, tuple[str, ...]]] = {"fp32-fp8base-cp2": (2, "fp32", (*CP2, *FP8))}
if os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") == "1":
    CASES["fp32-fsdp2"] = (2, "fp32", FSDP)
    CASES["bf16-fsdp2"] = (2, "bf16", FSDP)
    CASES["fp32-fp8base-fsdp2"] = (2, "fp32", (*FSDP, *FP8))
    CASES["fp32-fp8base-fsdp4"] = (4, "fp32", (*FSDP, *FP8))
    # through `vidforge train`'s loop, checkpoint and export: block swap under FSDP2 (2 blocks' shards in
    # host memory; the one-process reference swaps them itself) and FSDP2's CPU offload of every shard
    CASES["fp32-fp8base-fsdp2-swap"] = (2, "fp32", (*FSDP, *FP8, "train.lora.blocks_to_swap=2"))
    CASES["fp32-fsdp2-cpu-offload"] = (2, "fp32", (*FSDP, "train.fsdp_cpu_offload=true"))
    # the sharded LoRA on four cards: float8 base and block swap under FSDP2 over 4 ranks
    CASES["fp32-fp8base-fsdp4-swap"] = (4, "fp32", (*FSDP, *FP8, "train.lora.blocks_to_swap=2"))


def _train(rank: int, world: int, latents: str, base: str, run_dir: str, case: str) -> None:
    from vidforge.train import loop
    from vidforge.train.init_weights import WeightsInit

    _, precision, sets = CASES[case]
    if world == 1:  # the one-process reference: the same settings but the layout
        sets = tuple(item for item in sets if not item.startswith("parallel."))
    profile = train_profile(*SETS, f"train.precision={precision}", *sets, f"cluster.cpu_processes={world}")
    loop.run(profile, [latents], run_dir, init=WeightsInit(Path(base)))


@pytest.mark.parametrize("case", list(CASES))
def test_lora_under_fsdp2_matches_one_process(case, tmp_path) -> None:
    from safetensors.torch import load_file

    from vidforge.lora import WEIGHTS
    from vidforge.models import build_model
    from vidforge.weights.checkpoint import save_model

    latents = make_latents(tmp_path / "data", identical=True, samples=4)
    torch.manual_seed(7)  # a base off the builder's zero-initialised gates (which would keep gradients 0)
    model = build_model(train_profile(*SETS).model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    base = save_model(model, tmp_path / "base")
    world, precision, _ = CASES[case]
    runs = {n: tmp_path / f"world{n}" for n in (1, world)}
    _train(0, 1, str(latents), str(base), str(runs[1]), case)  # one process: this one
    run_ranks(_train, world, str(latents), str(base), str(runs[world]), case)
    loss_rel, adapter_mean = TOLERANCES[precision]
    single, sharded = losses(runs[1]), losses(runs[world])
    assert len(single) == 3 and len(set(single)) > 1
    assert sharded == pytest.approx(single, rel=loss_rel)
    one, two = (load_file(runs[w] / "export" / WEIGHTS) for w in (1, world))
    assert one.keys() == two.keys() and len(one) == 2 * 4 * 2 * 2
    for key, value in one.items():
        diff = (two[key] - value).abs()
        assert diff.mean() <= adapter_mean * value.abs().mean(), (key, diff.mean(), diff.max())
