"""Model families: one module and one registry line add a family that builds, trains, counts and plans
(the toy family below); no module outside a family's own branches on a family's name (a scan)."""

from __future__ import annotations

import ast
import math
import textwrap
from pathlib import Path

import pytest
from train_fixtures import synthetic_latents, train_profile

from vidforge import families
from vidforge.families import REGISTRY, family

SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"

# A family of its own: a DiT subclass (so it takes the DiT's forward arguments) with a preset, the DiT's
# TP plan and LoRA targets of its own choosing, written as a user would write one.
TOY = '''
from vidforge.families import FamilySpec
from vidforge.families.vidforge import block_scopes
from vidforge.families.vidforge.dit import DiT


class ToyNet(DiT):
    """A network of the toy family."""


SPEC = FamilySpec(
    name="toy",
    network="toy_family:ToyNet",
    presets={"toy-1": {"architecture": "dit", "layers": 3, "hidden": 32, "heads": 2, "mlp_hidden": 64}},
    tensor_parallel="vidforge.families.vidforge.tensor_parallel:apply_tp",
    tp_rules=(("q_norm", "k_norm", "modulation.down"), ("out", "fc2"), ("shared_modulation.", "final.modulation.")),
    lora_targets=("q", "v"),
    block_scopes=block_scopes,
)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch) -> str:
    (tmp_path / "toy_family.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY, "toy", "toy_family")  # the one registry line
    return "toy"


def test_a_toy_family_in_one_module_and_one_registry_line_builds_trains_and_plans(toy, tmp_path) -> None:
    from vidforge.estimate.memory_model import estimate_memory
    from vidforge.estimate.param_counts import parameter_counts
    from vidforge.models import build_model, count_parameters, forward_flops
    from vidforge.models.lora import default_targets
    from vidforge.profile.parallel import Layout
    from vidforge.train import loop

    profile = train_profile(
        "model.preset=toy-1", "model.text_dim=32", "model.in_channels=192", "train.steps=1"
    )
    assert profile.model.family == "toy" and profile.model.layers == 3
    model = build_model(profile.model)
    assert type(model).__name__ == "ToyNet"
    assert default_targets("toy") == ("q", "v")
    counts = parameter_counts(profile.model)
    assert counts.total == count_parameters(model)
    assert sum(forward_flops(profile.model, [(3, 4, 6)], 8).parts.values()) > 0
    assert estimate_memory(profile, Layout(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=2)).total > 0

    summary = loop.run(profile, [synthetic_latents(tmp_path)], tmp_path / "run")
    assert summary.last_step == 1 and math.isfinite(summary.final_loss_mean)


def test_an_unknown_family_is_refused_at_load_naming_the_registered_ones() -> None:
    from vidforge.profile import ProfileError

    with pytest.raises(ProfileError, match="model.family=nope: unknown 'nope'; use one of vidforge, wan"):
        train_profile("model.family=nope")


def test_every_registered_family_builds_its_presets_network() -> None:
    from vidforge.families import load
    from vidforge.models import build_model
    from vidforge.profile import PRESETS, Model

    for name in REGISTRY:
        spec = family(name)
        for preset in spec.presets:
            assert PRESETS[preset]["family"] == name
        model = build_model(Model(preset=next(iter(spec.presets))), device="meta")
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
