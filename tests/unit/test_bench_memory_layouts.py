"""The memory model under 2-rank layouts (gloo, in-process ranks) against what each rank holds: FSDP2
and HSDP, tensor parallel with and without sequence parallel, and context parallel with each of its
implementations, applied by the training loop's own `parallelize`. States: the local shards of
parameters, gradients, optimizer and EMA after a step (FSDP2 pads a tensor's first dimension to a
multiple of the group size: within a few hundred bytes of total / 2); activations: what autograd still
holds after the forward (for FSDP plus the last block's unsharded weights, which it keeps gathered for
the backward). Target (issue #8): within 15%; LoRA's (issue #34) within 10%.

Every case keeps an EMA (the default), so the TP cases hold its tensor-parallel shards too. The wan cases
hold its tensor-parallel plan (heads-spanning q/k norms split with the heads), with and without
sequence parallel, to the planner's rules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402
from test_bench_memory import LORA_TOLERANCE, TINY, TOLERANCE, WAN  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


CASES = {
    "fsdp-fp32-packed": [],
    "fsdp-bf16-plain": ["train.precision=bf16", "data.packing=false"],
    "tp2-sp": ["parallel.tp=2", "parallel.dp_shard=1"],
    "tp2-no-sp": [
        "parallel.tp=2",
        "parallel.dp_shard=1",
        "parallel.sequence_parallel=false",
    ],
    # Wan's plan: q/k/v and the first FFN projection column-wise, heads-spanning q/k norms split with them
    "wan-tp2": [
        *WAN,
        "parallel.tp=2",
        "parallel.dp_shard=1",
        "parallel.sequence_parallel=false",
    ],
    # ... and with sequence parallel: norms, modulation and residuals on half the tokens, norm2 and the
    # block tables replicated
    "wan-tp2-sp": [*WAN, "parallel.tp=2", "parallel.dp_shard=1"],
    "tp2-sp-plain-bf16": [
        "parallel.tp=2",
        "parallel.dp_shard=1",
        "data.packing=false",
        "train.precision=bf16",
    ],
    "cp2-all-gather": ["parallel.cp=2", "parallel.dp_shard=1"],
    "cp2-all-gather-regather": ["parallel.cp=2", "parallel.dp_shard=1", "parallel.cp_regather=true"],
    "cp2-ring": ["parallel.cp=2", "parallel.dp_shard=1", "parallel.cp_impl=ring"],
    "cp2-ulysses": ["parallel.cp=2", "parallel.dp_shard=1", "parallel.cp_impl=ulysses"],
    # LoRA (issue #34): FSDP2 gathers the frozen base as it is stored (bf16, or float8 bits), the adapters
    # computed in bf16 from FSDP's cast; and the float8 base under context parallel
    "wan-lora-fsdp-bf16": [*WAN, "train.lora={rank: 4}", "train.precision=bf16"],
    "wan-lora-fp8-cp2-ring": [
        *WAN,
        "train.lora={rank: 4, fp8_base: true}",
        "parallel.cp=2",
        "parallel.dp_shard=1",
        "parallel.cp_impl=ring",
    ],  # fmt: skip
}


def _measure(rank: int, world: int) -> dict[str, tuple[dict, dict]]:
    from vidforge.bench.train_bench import BenchStep
    from vidforge.estimate.memory_model import estimate_memory
    from vidforge.profile import load_profile

    out = {}
    for case, sets in CASES.items():  # one process group for every case: spawning ranks costs ~15 s
        profile = load_profile(None, [*TINY, f"cluster.cpu_processes={world}", *sets])
        step = BenchStep(profile)
        measured = step.measure_memory()
        est = estimate_memory(profile, step.dims.layout, step.workload)
        predicted = {n: est.get(n) for n in ("parameters", "gradients", "optimizer", "ema")}
        predicted["activations"] = est.get("activations") + est.get("weight copies")
        out[case] = (measured, predicted)
    return out


def test_memory_model_matches_measured_under_two_rank_layouts() -> None:
    for per_rank in run_ranks(_measure, 2):
        for case, (measured, predicted) in per_rank.items():
            for name in measured.keys() - {"activations"}:
                assert predicted[name] == pytest.approx(measured[name], rel=0.01), (case, name)
            tolerance = LORA_TOLERANCE if "lora" in case else TOLERANCE
            assert predicted["activations"] == pytest.approx(measured["activations"], rel=tolerance), case
