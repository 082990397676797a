"""`vidforge bench plan` on ST-DiT sequence parallel: the communication of st-hybrid and st-spatial against
their closed forms (what each moves per block, pads included), and the planner's choice between them per
layout: st-spatial where st-hybrid is refused (images and odd frame counts), the one that moves less
otherwise (st-spatial for the parallel block at cp=4, st-hybrid where st-spatial's pad columns cost more),
the profile's own on a tie."""

from __future__ import annotations

import pytest

from vidforge.bench.plan import rank_cp_impls, rank_layouts
from vidforge.estimate.comm_model import communication
from vidforge.estimate.workload import Workload
from vidforge.profile import load_profile
from vidforge.profile.layout_rules import layout_problems
from vidforge.profile.parallel import Layout

# small ST-DiT (6 layers, hidden 256, 8 heads, patch 1): bench clips of 4 x 8 x 8 latents; data buckets
# whose latent T (13 frames -> 4) and H x W (64 x 64 -> 8 x 8) divide by 2 and 4, so st-hybrid is valid
BASE = (
    "model.preset=small",
    "model.architecture=stdit",
    "cluster.accelerator=h100",
    "cluster.gpus_per_node=4",
    "train.precision=bf16",
    "data.frame_buckets=[13]",
    "data.buckets=[[64,64]]",
    "bench.latent_frames=4",
    "bench.latent_height=8",
    "bench.latent_width=8",
    "bench.text_tokens=16",
)
PADDED = ("bench.latent_height=9", "bench.latent_width=9")  # 81 positions: st-spatial pads to 4 x 21


def _profile(*sets: str):
    return load_profile(None, [*BASE, *sets])


@pytest.mark.parametrize("block", ["sequential", "parallel"])
def test_st_communication_matches_closed_forms(block: str) -> None:
    """Per block and pass, q, k, v and the output cross the cp group once each way: 8 x (c-1)/c of a
    rank's tokens x d / tp x e forward + backward; st-hybrid adds the parallel block's full attention as
    an all-gather of K/V (2 x (c-1) x local, forward and its reduce-scatter), st-spatial runs it
    head-parallel like the spatial attention. st-spatial's rank holds T x ceil(H W / c) tokens a clip."""
    layout = Layout(pp=1, dp_replicate=1, dp_shard=1, cp=4, tp=1)
    full = 1 if block == "parallel" else 0
    for impl in ("st-hybrid", "st-spatial"):
        p = _profile(f"model.stdit_block={block}", f"parallel.cp_impl={impl}", *PADDED)
        work = Workload.from_profile(p)
        (term,) = [t for t in communication(p, layout, work, microbatches=1) if t.dim.startswith("cp")]
        d, e, layers = p.model.hidden, 2, p.model.layers
        if impl == "st-hybrid":
            local = work.tokens / 4 * d * e  # 4 x 81 / 4
            expected = layers * (8 * 3 / 4 * local + full * 2 * 3 * local * 2)
        else:
            local = work.samples * 4 * 21 * d * e  # 21 = ceil(81 / 4) position columns
            expected = layers * 8 * 3 / 4 * local * (1 + full)
        assert term.dim == f"cp ({impl})"
        assert term.bytes == pytest.approx(expected)


def _choices(*sets: str, world: int = 4) -> dict[int, tuple[str, str]]:
    """cp degree -> (the chosen cp_impl, why) over the ranked layouts with context parallel and tp = 1."""
    report = rank_layouts(_profile(*sets), world_size=world)
    plans = [p for p in report.ranked if p.layout.cp > 1 and p.layout.tp == 1]
    assert plans
    return {p.layout.cp: (p.cp_impl, p.why[-1]) for p in plans}


def test_planner_takes_st_spatial_where_frame_slicing_is_refused() -> None:
    """Joint image-video buckets (1, 17, 33 frames: latent T = 1, 5, 9): st-hybrid is refused at every
    cp, and the plan says so; what it proposes passes the rulebook with the cp_impl it names."""
    joint = ("parallel.cp_impl=st-hybrid", "data.frame_buckets=[1,17,33]")
    for plan in rank_layouts(_profile(*joint), world_size=4).ranked:
        named = _profile(*joint, f"parallel.cp_impl={plan.cp_impl or 'st-hybrid'}")
        assert layout_problems(named, plan.layout) == [], plan.name
    for cp, (impl, why) in _choices(*joint).items():
        assert impl == "st-spatial"
        assert why.startswith(
            "parallel.cp_impl=st-spatial: st-hybrid is refused: data.frame_buckets: 1 frames"
        )
        assert f"parallel.cp={cp}" in why


def test_planner_keeps_the_slicing_that_moves_less() -> None:
    # parallel block, cp=4: st-hybrid all-gathers the full branch's K/V (2 x 3 units) where st-spatial
    # all-to-alls it (8 x 3/4 / 2 units): st-spatial, whichever the profile names; at cp=2 a tie: its own
    parallel = _choices("model.stdit_block=parallel", "parallel.cp_impl=st-hybrid")
    assert parallel[4][0] == "st-spatial" and parallel[2][0] == "st-hybrid"
    assert "st-hybrid predicts" in parallel[4][1]
    # sequential block, 81 positions: st-spatial's pad columns move 4 x 84 tokens where st-hybrid moves
    # 4 x 81: frame slicing kept even when the profile names st-spatial
    padded = _choices("model.stdit_block=sequential", "parallel.cp_impl=st-spatial", *PADDED)
    assert {impl for impl, _ in padded.values()} == {"st-hybrid"}


def test_bench_plan_lists_an_st_dits_two_sequence_parallels() -> None:
    """`bench plan` on an ST-DiT profile's own layout lists st-hybrid and st-spatial (not the
    full-attention implementations, which cannot run its spatial and temporal attention)."""
    p = _profile("parallel.cp_impl=st-hybrid", "data.frame_buckets=[1,17,33]", "cluster.cpu_processes=2")
    p = p.model_copy(update={"parallel": p.parallel.model_copy(update={"cp": 2})})
    choices = dict(rank_cp_impls(p))
    assert set(choices) == {"st-hybrid", "st-spatial"}
    assert (
        choices["st-spatial"].valid
        and "1 frames give 1 latent token frames" in choices["st-hybrid"].problems[0]
    )
