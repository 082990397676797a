"""The modes with layouts of their own (distillation, image-to-video by condition channels, first-frame
conditioning, one expert of two) in the one layout rulebook: every layout `bench plan --rank` ranks for
them, loaded as the profile `vidforge train` would get, is one the trainer builds (its own build and
step, by the dry run), and each refusal that moved into the rulebook now happens when the profile loads,
in one line naming the field and the fix."""

from __future__ import annotations

import pytest

from vidforge.bench.plan import LayoutPlan, rank_layouts
from vidforge.profile import ProfileError, RunProfile, load_profile
from vidforge.train.dry_run import dry_run

# A tiny model of the wan family on 4 CPU ranks: every layout the planner tries builds in a moment.
WAN = [
    "model.preset=wan2.1-1.3b", "model.layers=4", "model.heads=4", "model.hidden=64", "model.mlp_hidden=128",
    "model.text_dim=32", "model.abs_position=none", "diffusion.objective=flow",
]  # fmt: skip
WORLD = ["cluster.cpu_processes=4"]
MODES = {
    "I2V": ["model.image_dim=24", "model.condition_channels=8"],
    "TI2V": ["model.expand_timesteps=true", "diffusion.image_condition=0.5"],
    "experts": ["model.experts=2", "model.boundary_ratio=0.875", "train.expert=high"],
    "distill": ["train.distill={steps: 4}"],
}


def as_trained(profile: RunProfile, sets: list[str], plan: LayoutPlan) -> RunProfile:
    """The profile `vidforge train` gets for a ranked layout: the mode's settings and the plan's."""
    chosen = [f"parallel.{name}={degree}" for name, degree in plan.layout.degrees().items()]
    chosen += [f"parallel.vpp={plan.layout.vpp}", f"parallel.pp_microbatches={plan.microbatches}"]
    chosen += [f"train.activation_checkpointing={plan.checkpointing}"]
    if plan.cp_impl is not None:
        chosen.append(f"parallel.cp_impl={plan.cp_impl}")
    if plan.layout.pp > 1:
        chosen.append("train.grad_accum=1")  # the pipeline's micro-batches are its accumulation
    return load_profile(None, [*sets, *chosen])  # the rulebook, as at load: raises what it refuses


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_layout_the_planner_ranks_for_a_mode_the_trainer_builds(mode: str) -> None:
    sets = [*WAN, *WORLD, *MODES[mode]]
    profile = load_profile(None, sets)
    report = rank_layouts(profile)
    assert report.ranked
    for plan in report.ranked:
        trained = as_trained(profile, sets, plan)
        # the trainer's own build and training step, one rank per pipeline stage (its checks included)
        result = dry_run(trained)
        assert result.world_size == 4 and len(result.stages) == plan.layout.pp, plan.name
    ranked = {(p.layout.pp, p.layout.cp, p.layout.tp) for p in report.ranked}
    if mode == "TI2V":
        # the loss's per-token levels are not split by a cp shard, a pipeline stage or sequence parallel
        # yet: data and tensor parallel (sequence parallel, left unset, is off for it)
        assert ranked == {(1, 1, tp) for tp in (1, 2, 4)}, ranked
    elif mode == "distill":
        # DMD2's step (a LocalTrainStep) takes no pipeline stage and draws no cp shard: FSDP and tp
        assert ranked == {(1, 1, tp) for tp in (1, 2, 4)}, ranked
    else:  # the others train under every kind of parallel
        assert any(cp > 1 for _, cp, _ in ranked) and any(pp > 1 for pp, _, _ in ranked), ranked


def test_every_layout_the_planner_ranks_for_a_distillation_is_data_parallel() -> None:
    """DMD2's step runs its student, teacher and fake score whole on whole sequences (`vidforge.train.distill`:
    a LocalTrainStep that takes no cp shard and no pipeline stage): on 64 GPUs of a 7B model, where the
    planner once ranked dp_shard 8 x cp 8 first, every ranked layout is one of those."""
    profile = load_profile(
        "dit7b_74k_tp2_cp4_64xh100", ["train.distill={steps: 4}", "parallel.cp=1", "parallel.tp=1"]
    )
    report = rank_layouts(profile)
    assert report.ranked
    for plan in report.ranked:
        assert plan.layout.cp == 1 and plan.layout.pp == 1, plan.name
    assert any(p.layout.dp_shard > 1 for p in report.ranked) and any(p.layout.tp > 1 for p in report.ranked)
    refused = [p for p in report.rejected if p.layout.cp > 1]
    assert refused and all(any("train.distill runs one process" in q for q in p.problems) for p in refused)


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (
            ["train.distill={steps: 4}", "parallel.cp=2"],
            "parallel.cp: train.distill runs one process or data parallel",
        ),
        (
            ["train.distill={steps: 4}", "parallel.pp=2"],
            "parallel.pp: train.distill runs one process or data parallel",
        ),
        (
            [*MODES["I2V"], "parallel.tp=2"],
            "parallel.tp: the image cross-attention (model.image_dim=24) has no tensor-parallel plan yet",
        ),
        (
            [*MODES["I2V"], "train.validate_every=5"],
            "train.validate_every: 5: an image-to-video model's validation needs a first frame",
        ),
    ],
)
def test_a_moved_refusal_happens_when_the_profile_loads_in_one_line(sets: list[str], says: str) -> None:
    """(first-frame conditioning's: tests/unit/test_wan22_ti2v_training.py)"""
    with pytest.raises(ProfileError) as refused:
        load_profile(None, [*WAN, "cluster.cpu_processes=2", *sets])
    message = str(refused.value)
    field, words = says.split(": ", 1)  # the loader names the field by the --set that gave it
    assert field in message and words in message and "\n" not in message
    assert "set " in message.split(";")[-1]  # the fix


def test_sampling_refuses_the_image_cross_attention_under_infer_tp_by_the_same_rule() -> None:
    """The rule that moved out of the family's tensor-parallel plan holds for `vidforge infer --tp` too
    (`infer.plan.check_plan` asks the rulebook's sampling rules before the model loads)."""
    from vidforge.errors import UserInputError
    from vidforge.infer.plan import InferPlan, check_plan

    profile = load_profile(None, [*WAN, *MODES["I2V"]])
    plan = InferPlan.choose(2, 1.0, profile.model, tp=2)
    with pytest.raises(UserInputError, match=r"infer.tp: the image cross-attention .* set infer.tp=1"):
        check_plan(plan, profile)
    check_plan(InferPlan.choose(2, 1.0, profile.model), profile)  # its two ranks split the sequence
