"""One rulebook of layouts (vidforge.profile.layout_rules), asked by the profile validator, `bench plan`, the
dry run and the trainer: they agree on every shipped profile and on what the planner proposes, and a
layout the trainer cannot run is refused with the same line everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from vidforge.bench.plan import evaluate, rank_layouts, structural_problems
from vidforge.estimate.memory_model import estimate_memory
from vidforge.families import family
from vidforge.profile import ProfileError, apply_overrides, load_profile, validate_profile
from vidforge.profile.layout_rules import layout_problems, sampling_layout_problems, sequence_parallel
from vidforge.profile.parallel import Layout
from vidforge.train.dry_run import dry_run

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "profiles").glob("*.yaml"))


def test_profiles_are_shipped() -> None:
    assert len(SHIPPED) >= 6 and "local_cpu" in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_validator_planner_dry_run_and_trainer_agree_on_each_shipped_profile(name: str) -> None:
    profile = load_profile(name)  # the validator: it would raise with the rulebook's line
    layout = profile.layout
    assert layout_problems(profile, layout) == []
    # the planner evaluates the profile's own layout without a structural objection
    assert structural_problems(profile, layout) == []
    assert evaluate(profile).memory is not None
    # the dry run builds it with the trainer's own build and step, one rank per pipeline stage
    result = dry_run(profile)
    assert len(result.stages) == layout.pp and result.world_size == layout.world_size
    assert sorted(b for s in result.stages for b in s.blocks) == list(range(profile.model.layers))


@pytest.mark.parametrize("name", ["dit7b_74k_tp2_cp4_64xh100", "dit28b_74k_tp4_cp8_256xh100"])
def test_every_layout_the_planner_proposes_passes_the_rulebook(name: str) -> None:
    profile = load_profile(name)
    report = rank_layouts(profile)
    assert report.ranked
    for plan in report.ranked:
        assert layout_problems(profile, plan.layout) == [], plan.name
    # pipeline x context parallel trains: the planner proposes such layouts where they fit, and refuses
    # none of them for combining the two
    assert any(p.layout.pp > 1 and p.layout.cp > 1 for p in report.ranked)
    assert not any("pipeline does not split" in q for p in report.rejected for q in p.problems)


@pytest.mark.parametrize(
    ("degrees", "other", "line"),
    [
        ({"pp": 2}, ["train.grad_accum=2"], "train.grad_accum: parallel.pp=2 with grad_accum=2"),
        ({"pp": 2}, ["train.validate_every=5"], "train.validate_every: 5 with parallel.pp=2"),
        ({"tp": 4}, [], "parallel.tp: must divide model.heads=6, got 4"),
        ({"tp": 2}, ["train.lora={rank: 4}"], "train.lora: LoRA has no tensor-parallel plan (parallel.tp=2)"),
        ({"pp": 2}, ["train.lora={rank: 4}"], "train.lora: LoRA does not run under pipeline parallel"),
        (
            {"cp": 2},
            ["model.architecture=stdit", "parallel.cp_impl=ring"],
            "parallel.cp_impl: ring splits full attention only; model.architecture=stdit under cp=2",
        ),
        ({"tp": 2}, ["train.fp8=true"], "train.fp8: tensor parallel has no float8 plan (parallel.tp=2)"),
    ],
)
def test_a_layout_the_trainer_cannot_run_is_refused_with_the_same_line_everywhere(
    degrees, other, line
) -> None:
    world = ["cluster.cpu_processes=4", "model.layers=4", "model.heads=6", "model.hidden=48"]
    parallel = [f"parallel.{k}={v}" for k, v in degrees.items()]
    with pytest.raises(ProfileError) as refused:  # the validator, when the profile loads
        load_profile("local_cpu", [*world, *parallel, *other])
    # the loader names the field by the --set that gave it (`--set parallel.cp=2: ...`), then the same words
    field, words = line.split(": ", 1)
    assert words in str(refused.value) and field in str(refused.value)
    # the planner, handed that layout for the same settings (valid on their own), names the same problem
    base = load_profile("local_cpu", [*world, *other])
    pp, cp, tp = degrees.get("pp", 1), degrees.get("cp", 1), degrees.get("tp", 1)
    layout = Layout(pp, 1, 4 // (pp * cp * tp), cp, tp, 1, pp)
    assert any(line in problem for problem in structural_problems(base, layout))


def test_the_wan_family_trains_tp_with_and_without_sequence_parallel_and_pipelines() -> None:
    wan = [
        "model.family=wan", "model.mlp_act=gelu-tanh", "model.adaln_lora_rank=0", "model.abs_position=none",
        "model.heads=4", "model.layers=2", "cluster.cpu_processes=2",
    ]  # fmt: skip
    assert not sequence_parallel(
        load_profile("local_cpu", [*wan, "parallel.tp=2", "parallel.sequence_parallel=false"])
    )
    assert sequence_parallel(load_profile("local_cpu", [*wan, "parallel.tp=2"]))  # the family's choice: on
    assert load_profile("local_cpu", [*wan, "parallel.pp=2"])


# HunyuanVideo-1.5 at a width where a block's input is a visible share of a rank's memory
HY15 = {
    "family": "hunyuan15", "layers": 2, "hidden": 256, "heads": 4, "mlp_hidden": 1024, "refiner_layers": 1,
    "in_channels": 16, "text_dim": 64, "text_2_dim": 32, "text_2_tokens": 8, "rope_axes": [16, 24, 24],
}  # fmt: skip


def _hy15(**parallel):
    data = {"model": dict(HY15), "cluster": {"gpus_per_node": 2, "accelerator": "h100"}, "parallel": parallel}
    apply_overrides(data, family("hunyuan15").profile_defaults)
    return validate_profile(data, "hy15")


def _forced(profile, on: bool):
    """The profile with parallel.sequence_parallel set past the validator (what the run does not do)."""
    return profile.model_copy(
        update={"parallel": profile.parallel.model_copy(update={"sequence_parallel": on})}
    )


def test_sequence_parallel_left_unset_is_the_familys_choice_and_the_cost_model_follows_it() -> None:
    """parallel.sequence_parallel unset: HunyuanVideo-1.5 (whose tensor-parallel plan has none) loads at
    tp=2 and runs without it, the planner offers its tp=2 layout and costs it as the run goes (as with false
    set, not as under SP); asking for true is refused in one
    line, for training and for `vidforge infer`'s infer.tp."""
    hy15 = _hy15(tp=2)
    assert hy15.parallel.sequence_parallel is None and not sequence_parallel(hy15)
    memory = estimate_memory(hy15).total
    assert memory == estimate_memory(_hy15(tp=2, sequence_parallel=False)).total
    assert memory != estimate_memory(_forced(hy15, True)).total  # SP's all-gather buffer, its split input
    plans = {plan.layout.tp: plan for plan in rank_layouts(hy15).ranked if plan.layout.tp > 1}
    assert plans[2].memory.total == memory  # the planner's tp=2 is the run's
    with pytest.raises(ProfileError) as refused:
        _hy15(tp=2, sequence_parallel=True)
    message = str(refused.value)
    assert (
        "parallel.sequence_parallel: model.family=hunyuan15's tensor-parallel plan has no sequence" in message
    )
    assert "set parallel.sequence_parallel=false or leave it unset" in message and "\n" not in message
    sampling = _forced(_hy15(), True)
    assert sampling_layout_problems(sampling, Layout(1, 1, 1, 1, 2))[0].startswith(
        "parallel.sequence_parallel"
    )
    assert sampling_layout_problems(_hy15(), Layout(1, 1, 1, 1, 2)) == []


def test_sequence_parallel_left_unset_is_on_where_the_family_has_it() -> None:
    """The DiT's and Wan's plans have sequence parallel: unset means on, and the cost model splits a block's
    input over tp as explicit true does; first-frame conditioning turns it off (`test_wan22_ti2v_training`)."""
    wan = [
        "model.family=wan", "model.mlp_act=gelu-tanh", "model.adaln_lora_rank=0", "model.abs_position=none",
        "model.heads=4", "model.hidden=256", "model.layers=2", "cluster.gpus_per_node=2",
        "cluster.accelerator=h100", "parallel.tp=2",
    ]  # fmt: skip
    for sets in (wan, ["cluster.gpus_per_node=2", "cluster.accelerator=h100", "parallel.tp=2"]):
        profile = load_profile("local_cpu", sets)
        assert profile.parallel.sequence_parallel is None and sequence_parallel(profile)
        memory = estimate_memory(profile).total
        assert (
            memory
            == estimate_memory(_forced(profile, True)).total
            < estimate_memory(_forced(profile, False)).total
        )


def test_block_swap_runs_under_fsdp2_but_not_beside_its_cpu_offload() -> None:
    """Block swap under FSDP2 keeps the swapped blocks' shards in host memory (tests/distributed/
    test_train_lora_swap_fsdp.py trains it); FSDP2's CPU offload already keeps every block's there."""
    sets = ["cluster.cpu_processes=2", "model.layers=4", "train.lora={rank: 4, blocks_to_swap: 2}"]
    assert load_profile("local_cpu", sets).layout.dp_shard == 2
    with pytest.raises(ProfileError, match="train.fsdp_cpu_offload already keeps every block's FSDP2 shards"):
        load_profile("local_cpu", [*sets, "train.fsdp_cpu_offload=true"])
    assert load_profile("local_cpu", [*sets[1:], "train.fsdp_cpu_offload=true"])  # one process: no FSDP2
