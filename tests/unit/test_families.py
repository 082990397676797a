"""Model families: one package and one registry line add a family that builds, trains, counts and plans
(the toy family below); no module outside a family's own branches on a family's name (a scan)."""

from __future__ import annotations

import ast
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
from train_fixtures import synthetic_latents, train_profile

from vidforge import families
from vidforge.families import REGISTRY, family

SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"

# A family of its own, a package as a user would write one: its spec (torch-free), its model section (the
# DiT's options and a field of its own), and its network, a DiT subclass (so it takes the DiT's forward
# arguments) that reads that field; the DiT's TP plan and LoRA targets of its own choosing.
TOY = {
    "__init__.py": """
from vidforge.families import FamilySpec
from vidforge.families.vidforge import block_scopes
from toy_family.model import ToyModel

SPEC = FamilySpec(
    name="toy",
    model=ToyModel,
    network="toy_family.network:ToyNet",
    presets={"toy-1": {"architecture": "dit", "layers": 3, "hidden": 32, "heads": 2, "mlp_hidden": 64}},
    tensor_parallel="vidforge.families.vidforge.tensor_parallel:apply_tp",
    tp_rules=(
        ("q_norm", "k_norm", "modulation.down"),
        ("out", "fc2"),
        ("shared_modulation.", "final.modulation."),
        ("modulation.proj", "modulation.up"),
    ),
    lora_targets=("q", "v"),
    block_scopes=block_scopes,
)
""",
    "model.py": """
from typing import Literal

from vidforge.families.vidforge.model import VidforgeModel


class ToyModel(VidforgeModel):
    family: Literal["toy"] = "toy"
    output_scale: float = 1.0
    \"\"\"What the toy network multiplies its prediction by.\"\"\"
""",
    "network.py": """
from vidforge.families.vidforge.dit import DiT


class ToyNet(DiT):
    \"\"\"A network of the toy family.\"\"\"

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) * self.config.output_scale
""",
}


@pytest.fixture
def toy(tmp_path, monkeypatch) -> str:
    package = tmp_path / "toy_family"
    package.mkdir()
    for name, text in TOY.items():
        (package / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY, "toy", "toy_family")  # the one registry line
    yield "toy"
    for name in [m for m in sys.modules if m == "toy_family" or m.startswith("toy_family.")]:
        del sys.modules[name]


def test_a_toy_family_in_one_package_and_one_registry_line_builds_trains_and_plans(toy, tmp_path) -> None:
    from vidforge.estimate.memory_model import estimate_memory
    from vidforge.estimate.param_counts import parameter_counts
    from vidforge.lora import default_targets
    from vidforge.models import build_model, count_parameters, forward_flops
    from vidforge.profile.parallel import Layout
    from vidforge.train import loop

    profile = train_profile(
        "model.preset=toy-1",
        "model.text_dim=32",
        "model.in_channels=192",
        "model.output_scale=0.5",
        "train.steps=1",
    )
    assert profile.model.family == "toy" and profile.model.layers == 3
    assert type(profile.model).__name__ == "ToyModel" and profile.model.output_scale == 0.5
    model = build_model(profile.model)
    assert type(model).__name__ == "ToyNet"
    assert default_targets("toy") == ("q", "v")
    counts = parameter_counts(profile.model)
    assert counts.total == count_parameters(model)
    assert sum(forward_flops(profile.model, [(3, 4, 6)], 8).parts.values()) > 0
    assert estimate_memory(profile, Layout(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=2)).total > 0

    from vidforge.profile import RunProfile

    sections = RunProfile.model_json_schema()["properties"]["model"]["oneOf"]
    assert "output_scale" in next(s for s in sections if s["title"] == "ToyModel")["properties"]

    summary = loop.run(profile, [synthetic_latents(tmp_path)], tmp_path / "run")
    assert summary.last_step == 1 and math.isfinite(summary.final_loss_mean)


def test_an_unknown_family_is_refused_at_load_naming_the_registered_ones() -> None:
    from vidforge.profile import ProfileError

    with pytest.raises(ProfileError, match="model.family=nope: unknown 'nope'; use one of vidforge, wan"):
        train_profile("model.family=nope")


def test_the_model_section_is_its_familys_own_class_named_by_family_or_preset() -> None:
    from vidforge.profile import Model, RunProfile

    assert type(train_profile().model).__name__ == "VidforgeModel"  # no family: the default preset's
    wan = Model.model_validate({"preset": "wan2.1-1.3b"})
    assert type(wan) is family("wan").model and wan.cross_attn_norm and wan.architecture == "dit"
    assert type(Model.model_validate({"family": "wan", "preset": None, "hidden": 64})).__name__ == "WanModel"
    sections = {
        s["title"]: s["properties"] for s in RunProfile.model_json_schema()["properties"]["model"]["oneOf"]
    }
    assert set(sections) == {family(name).model.__name__ for name in REGISTRY}
    # each family's own fields, and only its own
    assert (
        "condition_channels" in sections["WanModel"] and "condition_channels" not in sections["VidforgeModel"]
    )
    assert "stdit_block" in sections["VidforgeModel"] and "stdit_block" not in sections["WanModel"]


def test_every_familys_section_answers_every_model_field() -> None:
    """Code reads any family's field of any model (`architecture`, `condition_channels`, ...): each section
    has it as a field or holds it constant (`FixedBlock`, `NoImageInputs`), so a family lacking one fails
    here rather than deep in the memory model. Fields named nowhere outside the family packages are read
    by their own family only."""
    from vidforge.profile import Model

    every = {f for name in REGISTRY for f in family(name).model.model_fields}
    # a field only its family's package reads (HunyuanVideo-1.5's refiner_layers) need not be on the others
    outside = "\n".join(
        p.read_text()
        for p in SRC.rglob("*.py")
        if not any(p.is_relative_to(SRC / "families" / n) for n in REGISTRY)
    )
    every = {f for f in every if re.search(rf"\.{f}\b|[\"']{f}[\"']", outside)}
    for name in REGISTRY:
        section = Model.model_validate({"preset": next(iter(family(name).presets))})
        assert sorted(f for f in every if not hasattr(section, f)) == [], name


def test_a_family_refuses_another_familys_fields_and_other_values_of_its_constants() -> None:
    from vidforge.profile import ProfileError

    with pytest.raises(
        ProfileError,
        match=r"--set model.expand_timesteps=true: only the wan family has it \(the vidforge family has False, got True\); set model.family=wan",
    ):
        train_profile("model.expand_timesteps=true")
    with pytest.raises(
        ProfileError,
        match="--set model.architecture=stdit: only the vidforge family has it .the wan family has 'dit', got 'stdit'.",
    ):
        train_profile("model.preset=wan2.1-1.3b", "model.architecture=stdit")
    with pytest.raises(
        ProfileError, match="--set model.nope=1: unknown field; valid fields here: preset, family, layers"
    ):
        train_profile("model.nope=1")
    # restating a constant is no contradiction (profiles written before the split say architecture: dit)
    from vidforge.profile import Model

    assert (
        Model.model_validate({"preset": "wan2.1-1.3b", "architecture": "dit", "image_dim": 0}).family == "wan"
    )
    # as text or a list, the way a setting arrives from the command line or YAML (a parallel infer run
    # hands its model section on with 'true' and '0')
    spelt = {
        "preset": "wan2.1-1.3b",
        "adaln_lora_rank": "0",
        "abs_position": "none",
        "stdit_block": "sequential",
    }
    assert Model.model_validate(spelt).family == "wan"
    with pytest.raises(ValueError, match="adaln_lora_rank: only the vidforge family has it"):
        Model.model_validate({**spelt, "adaln_lora_rank": "4"})


def test_every_registered_family_builds_its_presets_network() -> None:
    from vidforge.families import load
    from vidforge.models import build_model
    from vidforge.profile import PRESETS, Model

    for name in REGISTRY:
        spec = family(name)
        for preset in spec.presets:
            assert PRESETS[preset]["family"] == name
        model = build_model(Model.model_validate({"preset": next(iter(spec.presets))}), device="meta")
        assert isinstance(model, load(spec.network))


def _own_modules() -> set[Path]:
    """The modules the registered families name (their networks, weights and TP plans) and families/."""
    own = set((SRC / "families").rglob("*.py"))
    for name in REGISTRY:
        spec = family(name)
        for path in (spec.network, spec.tensor_parallel, spec.import_weights, spec.export_weights):
            if path is not None and path.startswith("vidforge."):
                own.add(SRC.joinpath(*path.partition(":")[0].split(".")[1:]).with_suffix(".py"))
    return own


def _family_branches(tree: ast.AST) -> list[int]:
    """Lines that compare a family field with a string, compare a string naming the family that is no
    other word (wan) with anything but a tokenizer's kind, call .startswith on a family's name, or key
    one table by several family names."""
    names = set(REGISTRY)

    def is_family(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "family") or (
            isinstance(node, ast.Name) and node.id == "family"
        )

    def is_str(node: ast.AST, among=None) -> bool:
        return (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (among is None or node.value in among)
        )

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(is_family(o) for o in operands) and any(is_str(o) for o in operands):
                lines.append(node.lineno)
            elif any(is_str(o, names - {"vidforge"}) for o in operands) and not any(
                isinstance(o, ast.Attribute) and o.attr == "kind" for o in operands
            ):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
        ):
            if any(is_str(a, names) for a in node.args):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and sum(is_str(k, names) for k in node.keys if k is not None) >= 2:
            lines.append(node.lineno)
    return lines


def test_no_module_outside_a_familys_own_branches_on_a_family_name() -> None:
    own = _own_modules()
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        if path not in own
        for line in _family_branches(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_scan_finds_what_it_forbids() -> None:
    code = 'if cfg.family == "wan": pass\nx = name.startswith("wan")\nT = {"wan": 1, "vidforge": 2}\n'
    assert _family_branches(ast.parse(code)) == [1, 2, 3]
    assert _family_branches(ast.parse('if tok.kind == "wan": pass\n')) == []


def test_families_import_no_torch() -> None:
    """The registry sits below the profile: reading it loads no network code."""
    import subprocess
    import sys

    code = (
        "import sys, vidforge.families as f; [f.family(n) for n in f.names()]; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert families.names() == list(REGISTRY)
