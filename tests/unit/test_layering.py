"""Imports go down the layers, never up: token rows (tokens/) below data and models, models know nothing
of parallel/, parallel/ nothing of train/ or infer/, the diffusion math no profile and no process group. Checked on every import statement, lazy ones
inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"

# package (or module) -> what it must not import
FORBIDDEN = {
    "models": ("vidforge.parallel", "vidforge.train", "vidforge.infer", "vidforge.bench", "vidforge.cli"),
    "parallel": ("vidforge.train", "vidforge.infer", "vidforge.bench", "vidforge.cli"),
    "diffusion": (
        "vidforge.models",
        "vidforge.parallel",
        "vidforge.train",
        "vidforge.infer",
        "torch.distributed",
    ),
    "diffusion/edm.py": ("vidforge.profile",),
    "diffusion/objective.py": ("vidforge.profile",),
    "data": ("vidforge.models", "vidforge.train", "vidforge.infer", "vidforge.bench", "vidforge.cli"),
    "tokens": (
        "vidforge.models",
        "vidforge.parallel",
        "vidforge.data",
        "vidforge.train",
        "torch.distributed",
    ),
    "profile": ("torch", "vidforge.models", "vidforge.parallel", "vidforge.train"),
    # the family registry sits below the profile: names and data, its code loaded by import path
    "families": ("torch", "vidforge.profile", "vidforge.models", "vidforge.parallel", "vidforge.train"),
    # sampling shared by training's validation and inference sits below both
    "sampling": ("vidforge.train", "vidforge.infer", "vidforge.bench", "vidforge.cli"),
    "train": ("vidforge.infer", "vidforge.cli"),
}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


@pytest.mark.parametrize("where", sorted(FORBIDDEN))
def test_imports_go_down_the_layers(where: str) -> None:
    target = SRC / where
    files = [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
    assert files
    bad = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in files
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[where])
    ]
    assert bad == []
