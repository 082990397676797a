"""`vidforge bench plan` and 2D context parallel (cp_impl=usp): its two collectives against their closed
forms and their links (the Ulysses all-to-all inside a node, the ring across), and the ranking of a
layout's CP implementations: 2D first where the 1D ring would cross nodes and the heads allow the
Ulysses degree, 1D where they do not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vidforge.bench.plan import cp_choices, rank_cp_impls, structural_problems
from vidforge.cli.app import app
from vidforge.estimate.comm_model import communication
from vidforge.estimate.workload import Workload
from vidforge.profile import load_profile
from vidforge.profile.parallel import Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_bench_plan import WORKED_EXAMPLE  # noqa: E402  (dit-14b, 72K tokens, cp 16 over 2 nodes of 8)


def _profile(*sets: str):
    return load_profile("dit7b_74k_tp2_cp4_64xh100", [*WORKED_EXAMPLE, *sets])


def test_usp_communication_matches_its_closed_form_and_links() -> None:
    p = _profile("parallel.cp_impl=usp", "parallel.cp_ulysses=8")
    work = Workload.from_profile(p)
    terms = {t.dim: t for t in communication(p, p.layout, work, microbatches=1, checkpointing="full")}
    local = work.tokens / 16 * p.model.hidden * 2  # K of one rank and layer, bf16, tp 1
    layers = p.model.layers
    # full recompute: 2 forward passes. all-to-all of q, k, v, out: 4 per pass and 4 backward, 7/8 sent
    assert terms["cp (usp ulysses)"].bytes == pytest.approx(layers * (4 * 2 + 4) * 7 / 8 * local)
    # ring of 2: K/V passed once per forward pass, K/V and their gradients once backward
    assert terms["cp (usp ring)"].bytes == pytest.approx(layers * (2 * 2 + 4) * 1 * local)
    assert terms["cp (usp ulysses)"].link == "intra-node" and not terms["cp (usp ulysses)"].overlapped
    assert terms["cp (usp ring)"].link == "inter-node" and terms["cp (usp ring)"].overlapped
    ring = {t.dim: t for t in communication(_profile("parallel.cp_impl=ring"), p.layout, work, 1, "full")}
    # The 1D ring passes 15 blocks of the same bytes, over the slow links.
    assert ring["cp (ring)"].bytes == pytest.approx(15 * terms["cp (usp ring)"].bytes)


def test_planner_picks_2d_where_the_ring_crosses_nodes_and_heads_allow() -> None:
    """cp 16 over 2 nodes of 8 (the worked example): the 1D ring's 15 transfers a layer run on the
    inter-node links and outlast the compute they should hide; Ulysses over 16 is refused (40 heads);
    usp with 8 Ulysses ranks in each node and a ring of 2 is fastest."""
    p = _profile()
    choices = rank_cp_impls(p)
    assert [name for name, _ in choices][0] == "usp 8x2"
    by_name = dict(choices)
    assert by_name["usp 8x2"].step_s < min(by_name[n].step_s for n in ("ring", "all-gather", "usp 2x8"))
    assert not by_name["ulysses"].valid and "model.heads=40" in by_name["ulysses"].problems[0]
    assert {name for name, _ in choices} == {"all-gather", "ring", "ulysses", "usp 2x8", "usp 4x4", "usp 8x2"}


def test_planner_keeps_1d_when_heads_refuse_every_ulysses_degree() -> None:
    """With 5 heads (hidden 640) no Ulysses degree above 1 divides them: every usp choice is refused
    with the field to change, and a 1D implementation is ranked first."""
    p = _profile("model.heads=5", "model.hidden=640")
    choices = rank_cp_impls(p)
    assert choices[0][0] in ("all-gather", "ring") and choices[0][1].valid
    refused = [plan for name, plan in choices if name.startswith("usp")]
    assert refused and all("parallel.cp_ulysses" in plan.problems[0] for plan in refused)


def test_cp_choices_are_the_1d_ones_and_every_inner_ulysses_degree() -> None:
    assert cp_choices(2) == [("all-gather", 1), ("ring", 1), ("ulysses", 1)]
    assert [u for impl, u in cp_choices(12) if impl == "usp"] == [2, 3, 4, 6]


def test_bench_plan_lists_the_cp_implementations_of_the_layout() -> None:
    argv = ["bench", "plan", "--profile", "dit7b_74k_tp2_cp4_64xh100"]
    for item in WORKED_EXAMPLE:
        argv += ["--set", item]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    listing = result.output.split("context parallel, by implementation (fastest first):")[1]
    assert listing.split()[0:2] == ["usp", "8x2"]


def test_a_usp_profile_leaves_layouts_without_context_parallel_to_the_planner() -> None:
    """The rulebook refuses a cp that cp_ulysses does not divide, not the layouts with no cp at all."""
    p = _profile("parallel.cp_impl=usp", "parallel.cp_ulysses=8")
    assert structural_problems(p, Layout(pp=1, dp_replicate=4, dp_shard=32, cp=1, tp=1)) == []
    refused = structural_problems(p, Layout(pp=1, dp_replicate=4, dp_shard=8, cp=4, tp=1))
    assert refused == [
        "parallel.cp_ulysses: 8 must divide parallel.cp=4 (cp = cp_ulysses x cp_ring); change cp_ulysses or cp"
    ]
