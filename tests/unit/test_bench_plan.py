"""`vidforge bench plan`: communication volumes against their closed forms, which links a group uses,
layouts ranked (FSDP alone for a small model at short context, context parallel once activations
outgrow a GPU) and invalid layouts rejected with the field to change; the worked example of
docs/benchmarks.md (dit-14b, 72K tokens, 128 GPUs)."""

from __future__ import annotations

import pytest

from vidforge.bench.plan import evaluate, format_plan, format_ranking, rank_layouts, structural_problems
from vidforge.estimate.comm_model import communication, group_link
from vidforge.estimate.memory_model import GIB
from vidforge.estimate.param_counts import parameter_counts
from vidforge.estimate.workload import Workload
from vidforge.profile import load_profile
from vidforge.profile.parallel import Layout

H100_NODE = [
    "cluster.accelerator=h100",
    "cluster.gpus_per_node=8",
    "train.precision=bf16",
    "model.abs_position=none",
]
WORKED_EXAMPLE = [
    "model.preset=dit-14b",
    "cluster.nodes=16",
    "cluster.accelerator=h200",
    "parallel.dp_replicate=4",
    "parallel.dp_shard=2",
    "parallel.cp=16",
    "parallel.tp=1",
    "bench.latent_frames=18",
    "bench.latent_height=128",
    "bench.latent_width=128",
    "bench.text_tokens=512",
    "train.precision=bf16",
    "train.activation_checkpointing=full",
    # the worked example of docs/benchmarks.md was planned at the assumed 50%, not the H200's measured rate
    "bench.achievable_mfu=0.5",
]


def profile(*sets: str, name: str = "dit7b_74k_tp2_cp4_64xh100"):
    return load_profile(name, list(sets))


def test_group_links_follow_the_mesh_order() -> None:
    p = profile()  # 8 nodes x 8 GPUs
    layout = Layout(pp=1, dp_replicate=1, dp_shard=8, cp=4, tp=2)
    assert group_link(p, layout, ("tp",))[0] == "intra-node"  # 2 neighbouring ranks
    assert group_link(p, layout, ("cp",))[0] == "intra-node"  # 4 groups of 2: 8 ranks, one node
    assert group_link(p, layout, ("dp_shard", "cp"))[0] == "inter-node"  # 64 ranks


def test_communication_volumes_match_their_closed_forms() -> None:
    small = ("model.preset=small", "model.in_channels=4", "bench.latent_height=16", "bench.latent_width=16")
    p = profile(*small, "bench.latent_frames=4", "bench.text_tokens=16", *H100_NODE[:2])
    counts = parameter_counts(p.model)
    work = Workload.from_profile(p)
    d, e = p.model.hidden, 2
    layout = Layout(pp=1, dp_replicate=2, dp_shard=4, cp=4, tp=2)
    terms = {t.dim: t for t in communication(p, layout, work, microbatches=1)}
    stage = counts.outside - counts.outside_tp / 2 + p.model.layers * (counts.block - counts.block_tp / 2)
    assert terms["fsdp"].bytes == pytest.approx(15 / 16 * stage * (2 * e + 4))
    assert terms["dp_replicate"].bytes == pytest.approx(2 * 1 / 2 * stage / 16 * 4)
    tokens = work.tokens / 4
    assert terms["tp"].bytes == pytest.approx(p.model.layers * 3 * 2 * 3 * (1 / 2) * tokens * d * e)
    assert terms["cp (all-gather)"].bytes == pytest.approx(p.model.layers * 2 * 3 * tokens * d / 2 * e * 2)
    assert not terms["tp"].overlapped and terms["fsdp"].overlapped
    # Twice the tokens: twice the TP and CP traffic, the same FSDP traffic.
    longer = profile(*small, "bench.latent_frames=8", "bench.text_tokens=16", *H100_NODE[:2])
    more = {t.dim: t for t in communication(longer, layout, Workload.from_profile(longer), microbatches=1)}
    assert more["tp"].bytes == pytest.approx(2 * terms["tp"].bytes)
    assert more["fsdp"].bytes == pytest.approx(terms["fsdp"].bytes)


def test_small_model_short_context_ranks_fsdp_alone_first() -> None:
    p = load_profile(None, ["model.preset=small", "model.in_channels=4", *H100_NODE, "train.micro_batch=4"])
    report = rank_layouts(p, world_size=8)
    best = report.ranked[0].layout
    assert (best.tp, best.cp, best.pp) == (1, 1, 1)
    assert report.ranked[0].checkpointing == "none"
    assert "by family of layouts" in format_ranking(report)


def test_long_context_needs_context_parallel() -> None:
    # dit-7b on 64 H100s at 18x64x64 = 74K tokens still fits with FSDP alone and full recompute (a block's
    # input per layer plus one block's activations); at 4x that (295K tokens) one block's recompute alone
    # outgrows 80 GB, so every valid layout splits the sequence (CP) or the heads (TP).
    long = (
        "bench.latent_frames=72",
        "bench.latent_height=128",
        "bench.latent_width=128",
        "bench.text_tokens=512",
    )
    report = rank_layouts(profile(*long))
    assert report.ranked, format_ranking(report)
    assert all(plan.layout.cp * plan.layout.tp > 1 for plan in report.ranked)
    fsdp_only = [r for r in report.rejected if (r.layout.cp, r.layout.tp, r.layout.pp) == (1, 1, 1)]
    assert fsdp_only and all("GiB per rank" in r.problems[0] for r in fsdp_only)
    shorter = [profile(f"bench.latent_frames={f}", *long[1:]) for f in (18, 72)]
    assert evaluate(shorter[0]).memory.total < evaluate(shorter[1]).memory.total


def test_invalid_layouts_are_rejected_with_the_field_to_change() -> None:
    p = profile()
    problems = structural_problems(p, Layout(pp=3, dp_replicate=1, dp_shard=1, cp=1, tp=3))
    assert any(s.startswith("parallel.tp: must divide model.heads=32, got 3") for s in problems)
    assert any(s.startswith("parallel.pp: pp x vpp = 3 must divide model.layers=28") for s in problems)
    across = structural_problems(p, Layout(pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=16))
    assert any("spans nodes" in s for s in across)
    report = rank_layouts(p)
    assert all(plan.layout.tp <= 8 and 32 % plan.layout.tp == 0 for plan in report.ranked)
    assert any(p.problems for p in report.rejected)


def test_worked_example_dit14b_72k_tokens_on_128_gpus() -> None:
    p = profile(*WORKED_EXAMPLE)
    assert p.layout.world_size == 128 and Workload.from_profile(p).tokens == 73_728
    plan = evaluate(p)
    assert plan.valid, plan.problems
    counts = parameter_counts(p.model)
    # FSDP shards over dp_shard x cp = 32 ranks; HSDP replicates that 4 times.
    assert plan.memory.get("parameters") == pytest.approx(counts.total / 32 * 4)
    assert plan.memory.get("optimizer") == pytest.approx(2 * plan.memory.get("parameters"))
    assert plan.memory.total < 0.9 * 141 * GIB
    without = evaluate(p, checkpointing="none")
    assert without.memory.get("activations") > 20 * plan.memory.get("activations")
    assert not without.valid  # 150.1 GiB: 40 blocks of 4,608 packed tokens and gathered K/V > 127 GiB
    text = format_plan(plan, p)
    assert "parameters" in text and "cp (all-gather)" in text and "predicted step" in text
