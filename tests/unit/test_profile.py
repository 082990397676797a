"""The run-profile: every validation rule rejects a bad profile with a message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vidforge.profile import ProfileError, RunProfile, load_profile
from vidforge.section import Section

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "profiles").glob("*.yaml"))


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(tmp_path: Path, data: dict, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(write(tmp_path, data), overrides)
    message = str(info.value)
    assert "\n" not in message, "errors must be one line"
    return message


CPU4 = {"cluster": {"accelerator": "cpu", "cpu_processes": 4}}
GPU64 = {"cluster": {"accelerator": "h100", "nodes": 8, "gpus_per_node": 8}}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_profile_validates(path: Path) -> None:
    profile = load_profile(path)
    assert profile.layout.world_size == profile.cluster.world_size
    assert profile.name == path.stem


def test_the_default_profile_is_local_cpu(monkeypatch) -> None:
    monkeypatch.delenv("VIDFORGE_PROFILE", raising=False)
    assert load_profile() == load_profile(ROOT / "profiles" / "local_cpu.yaml")
    assert load_profile().layout.world_size == 1


def test_world_size_must_equal_layout_product(tmp_path: Path) -> None:
    msg = error_of(tmp_path, {**CPU4, "parallel": {"tp": 2, "dp_shard": 3}})
    assert "parallel: " in msg and "world size is 4" in msg and "dp_shard" in msg


def test_dp_shard_minus_one_takes_the_rest(tmp_path: Path) -> None:
    layout = load_profile(write(tmp_path, {**GPU64, "parallel": {"tp": 2, "cp": 4}})).layout
    assert (layout.dp_shard, layout.cp, layout.tp, layout.world_size) == (8, 4, 2, 64)


def test_rest_must_divide_world(tmp_path: Path) -> None:
    msg = error_of(tmp_path, {**CPU4, "model": {"preset": "small"}, "parallel": {"cp": 3}})
    assert "does not divide the world size 4" in msg


def test_tp_must_divide_heads(tmp_path: Path) -> None:
    data = {**GPU64, "model": {"preset": "dit-28b", "heads": 24, "hidden": 24 * 64}, "parallel": {"tp": 5}}
    msg = error_of(tmp_path, data)
    assert "parallel.tp: must divide model.heads=24, got 5" in msg


def test_ulysses_needs_tp_times_cp_to_divide_heads(tmp_path: Path) -> None:
    data = {**GPU64, "model": {"preset": "dit-7b", "heads": 24, "hidden": 24 * 128}}
    data["parallel"] = {"tp": 4, "cp": 8, "cp_impl": "ulysses"}  # 24 % 32 != 0
    assert "parallel.cp: ulysses context parallel needs tp x cp = 32" in error_of(tmp_path, data)
    data["parallel"]["cp_impl"] = "ring"  # ring has no such constraint
    assert load_profile(write(tmp_path, data)).layout.cp == 8


def test_usp_needs_tp_times_cp_ulysses_to_divide_heads_and_cp_ulysses_to_divide_cp(tmp_path: Path) -> None:
    data = {**GPU64, "model": {"preset": "dit-7b", "heads": 24, "hidden": 24 * 128}}
    data["parallel"] = {"tp": 4, "cp": 8, "cp_impl": "usp", "cp_ulysses": 4}  # 24 % 16 != 0
    assert "parallel.cp_ulysses: usp splits heads over tp x cp_ulysses = 16" in error_of(tmp_path, data)
    data["parallel"]["cp_ulysses"] = 3  # 24 % 12 == 0, but 3 does not divide cp=8
    assert "parallel.cp_ulysses: 3 must divide parallel.cp=8" in error_of(tmp_path, data)
    data["parallel"]["cp_ulysses"] = 2  # the ring takes the other 4: 24 heads % (tp 4 x 2) == 0
    assert load_profile(write(tmp_path, data)).parallel.cp_ulysses == 2


def test_cp_ulysses_is_only_for_usp(tmp_path: Path) -> None:
    data = {"parallel": {"cp": 2, "cp_impl": "ring", "cp_ulysses": 2}}
    assert "parallel.cp_ulysses: 2 is the Ulysses degree of cp_impl=usp" in error_of(tmp_path, data)


def test_pp_times_vpp_must_divide_layers(tmp_path: Path) -> None:
    data = {**GPU64, "model": {"preset": "dit-7b"}}
    data["parallel"] = {"pp": 4, "vpp": 2, "pp_schedule": "interleaved-1f1b"}  # 8 does not divide 28
    assert "parallel.pp: pp x vpp = 8 must divide model.layers=28" in error_of(tmp_path, data)


def test_interleaved_schedule_needs_vpp(tmp_path: Path) -> None:
    parallel = {"pp": 2, "pp_schedule": "interleaved-1f1b"}
    msg = error_of(tmp_path, {"cluster": {"cpu_processes": 2}, "model": {"layers": 2}, "parallel": parallel})
    assert msg.endswith("parallel.pp_schedule: interleaved-1f1b needs parallel.vpp >= 2; set vpp or use 1f1b")


def test_vpp_needs_interleaved_schedule(tmp_path: Path) -> None:
    assert "parallel.vpp: " in error_of(tmp_path, {"parallel": {"vpp": 2}})


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (
            "cp_impl",
            "zigzag",
            "parallel.cp_impl: Input should be 'all-gather', 'ring', 'ulysses', 'usp', 'st-hybrid' or 'st-spatial'",
        ),
        ("pp_schedule", "zb", "parallel.pp_schedule: Input should be 'gpipe', '1f1b' or 'interleaved-1f1b'"),
        ("tp", 0, "parallel.tp: Input should be greater than or equal to 1, got 0"),
        ("dp_shard", 0, "parallel.dp_shard: must be >= 1, or -1"),
        ("tp", "two", "parallel.tp: Input should be a valid integer"),
    ],
)
def test_impossible_values_name_the_field(tmp_path: Path, field: str, value: object, expected: str) -> None:
    assert expected in error_of(tmp_path, {"parallel": {field: value}})


@pytest.mark.parametrize("value", [-1, "many", 2.5, True])
def test_decode_workers_is_a_count_or_auto(tmp_path: Path, value: object) -> None:
    expected = f"curation.decode_workers: expected a process count (0 or more) or 'auto', got {value!r}"
    assert expected in error_of(tmp_path, {"curation": {"decode_workers": value}})


def test_st_hybrid_needs_stdit(tmp_path: Path) -> None:
    data = {"cluster": {"cpu_processes": 2}, "parallel": {"cp": 2, "cp_impl": "st-hybrid"}}
    assert "parallel.cp_impl: st-hybrid is for model.architecture=stdit" in error_of(tmp_path, data)


def test_st_hybrid_needs_frames_and_positions_divisible_by_cp(tmp_path: Path) -> None:
    # 4x temporal, 8x spatial, patch (1, 2, 2): 9 frames -> 3 token frames; 48x64 -> 3x4 = 12 positions
    data = {
        "cluster": {"cpu_processes": 2},
        "parallel": {"cp": 2, "cp_impl": "st-hybrid"},
        "model": {"architecture": "stdit"},
        "data": {"frame_buckets": [9], "buckets": [[48, 64], [48, 48]]},
    }
    msg = error_of(tmp_path, data)
    assert "data.frame_buckets: 9 frames give 3 latent token frames, not divisible by parallel.cp=2" in msg
    assert "(48, 48) gives 9 token positions" in msg and "(48, 64)" not in msg


def test_unknown_keys_are_errors_with_the_valid_ones(tmp_path: Path) -> None:
    msg = error_of(tmp_path, {"parallel": {"tensor_parallel": 2}})
    assert msg.startswith(
        f"{tmp_path / 'p.yaml'}: parallel.tensor_parallel: unknown field; valid fields here:"
    )
    assert "tp" in msg
    assert "clusterr: unknown field" in error_of(tmp_path, {"clusterr": {}})


def test_unknown_preset_and_accelerator(tmp_path: Path) -> None:
    assert "model.preset: unknown 'dit-3b'" in error_of(tmp_path, {"model": {"preset": "dit-3b"}})
    assert "cluster.accelerator: unknown accelerator 'tpu'" in error_of(
        tmp_path, {"cluster": {"accelerator": "tpu"}}
    )


def test_model_shape_rules(tmp_path: Path) -> None:
    assert "model.hidden: must be divisible by model.heads=5" in error_of(tmp_path, {"model": {"heads": 5}})


def test_sigma_range(tmp_path: Path) -> None:
    msg = error_of(tmp_path, {"diffusion": {"sigma_min": 100.0}})
    assert "diffusion.sigma_min: must be below diffusion.sigma_max=80.0" in msg


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("parallel: [tp: 2\n")
    with pytest.raises(ProfileError, match=r"bad.yaml: not valid YAML at line"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="profile not found: nope.yaml; pass --profile PATH"):
        load_profile("nope.yaml")
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n")
    with pytest.raises(ProfileError, match="top level must be a mapping"):
        load_profile(top)


def test_overrides_are_typed_by_the_schema(tmp_path: Path) -> None:
    path = write(tmp_path, CPU4)
    profile = load_profile(path, ["parallel.tp=2", "parallel.sequence_parallel=false", "model.patch=[1,1,1]"])
    assert profile.parallel.tp == 2 and profile.parallel.sequence_parallel is False
    assert profile.model.patch == (1, 1, 1)
    # a shorthand accelerator name can still be overridden field by field
    gpu = load_profile(path, ["cluster.accelerator=h200", "cluster.accelerator.memory_gib=100"])
    assert gpu.cluster.accelerator.peak_bf16_flops == 989e12 and gpu.cluster.accelerator.memory_gib == 100
    with pytest.raises(ProfileError, match="expected section.field=value"):
        load_profile(path, ["parallel.tp"])


def test_preset_fills_fields_and_explicit_fields_win() -> None:
    profile = RunProfile.model_validate({"model": {"preset": "dit-7b", "layers": 4}})
    assert (profile.model.layers, profile.model.hidden, profile.model.heads) == (4, 4096, 32)


def test_profile_is_frozen() -> None:
    with pytest.raises(Exception, match="frozen"):
        RunProfile().parallel.tp = 2  # type: ignore[misc]


def _sections(model: type[Section]) -> list[type[Section]]:
    found = [model]
    for field in model.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            found += _sections(field.annotation)
    return found


def test_every_field_is_documented() -> None:
    undocumented = [
        f"{section.__name__}.{name}"
        for section in _sections(RunProfile)
        for name, field in section.model_fields.items()
        if not field.description
    ]
    assert undocumented == []


def test_default_and_shipped_names_resolve_from_any_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VIDFORGE_PROFILE", raising=False)
    assert load_profile().name == "local_cpu"
    assert load_profile("dit1b_1xh200").model.hidden == 1536
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "local_cpu.yaml").write_text("name: mine\n")  # a user's own comes first
    assert load_profile().name == "mine"


@pytest.mark.parametrize("value", ["inf", "-inf", ".inf", "nan"])
def test_no_number_in_a_profile_may_be_inf_or_nan(tmp_path, value):
    with pytest.raises(ProfileError, match=rf"^--set train.lr={value}: Input should be a finite number"):
        load_profile(None, [f"train.lr={value}"])
    path = tmp_path / "p.yaml"
    path.write_text(f"curation:\n  caption:\n    aesthetic:\n      min_score: {value}\n")
    with pytest.raises(
        ProfileError, match=f"^{path}: curation.caption.aesthetic.min_score: Input should be a fin"
    ):
        load_profile(path)


def test_an_error_in_a_set_value_names_the_set_and_one_in_the_file_names_the_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("train:\n  warmup_steps: -1\n")
    with pytest.raises(ProfileError) as err:
        load_profile(path, ["train.lr=0", "model.hidden=64"])
    assert str(err.value) == (
        "--set train.lr=0: Input should be greater than 0, got 0; "
        f"{path}: train.warmup_steps: Input should be greater than or equal to 0, got -1"
    )


def test_field_descriptions_are_the_docstrings_under_them_as_pydantic_reads_them() -> None:
    """Section reads each module's source once (pydantic parsed it again for every class); what it finds
    must be what pydantic's own `use_attribute_docstrings` finds."""
    from pydantic import BaseModel, ConfigDict, Field

    class Ours(Section):
        width: int = 3
        """How wide.

        In pixels."""
        named: str = Field("x", description="given in the field")
        """not this one"""
        plain: int = 1

    class Theirs(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        width: int = 3
        """How wide.

        In pixels."""
        named: str = Field("x", description="given in the field")
        """not this one"""
        plain: int = 1

    ours = {name: f.description for name, f in Ours.model_fields.items()}
    assert ours == {name: f.description for name, f in Theirs.model_fields.items()}
    assert ours == {"width": "How wide.\n\nIn pixels.", "named": "given in the field", "plain": None}
