"""One owner for each decision: a scan of src/vidforge finds each decision made in its owner's file and
nowhere else. Device choice (`auto` resolved to a GPU or the CPU), meshes and process groups, FSDP, the
training compute dtype and the file types read as videos. Each pattern is held to the second copies
this scan was written against (`SECOND_COPIES`), so a pattern that can no longer see them fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"

# decision -> (its owner, relative to src/vidforge; the lines that make it)
OWNERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "device choice": (
        "device.py",
        (
            r"""["']cuda["']\s+if\s+(not\s+)?torch\.cuda\.is_available\(\)""",
            r"""==\s*["']auto["'].*torch\.cuda\.is_available\(\)""",
            r"""def \w*_device\(""",
        ),
    ),
    "meshes and process groups": (
        "parallel/dims.py",
        (r"init_device_mesh\(", r"\bDeviceMesh\(", r"new_subgroups_by_enumeration\(", r"\bnew_group\("),
    ),
    "FSDP": ("parallel/fsdp.py", (r"\bfully_shard\(",)),
    "compute dtype": ("parallel/parallelize.py", (r"torch\.bfloat16 if .*precision",)),
    "video extensions": ("profile/data.py", (r"""["']\.?mp4["'].*["']\.?(webm|mkv|mov|avi)["']""",)),
}

# What the scan was written against: the second copies it replaced (each must be seen).
SECOND_COPIES = {
    "device choice": (
        'return torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        'if choice == "auto" and torch.cuda.is_available():',
        "def resolve_device(name: str) -> str:",
    ),
    "meshes and process groups": ("mesh = init_device_mesh(runtime.device.type, (runtime.world,))",),
    "FSDP": ("        fully_shard(module, mesh=mesh)",),
    "compute dtype": ('param_dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32',),
    "video extensions": ('media = [e for e in members if e in ("mp4", "webm", "mkv", "mov", "avi")]',),
}


def _makes(text: str, decision: str) -> list[str]:
    patterns = [re.compile(p) for p in OWNERS[decision][1]]
    return [line.strip() for line in text.splitlines() if any(p.search(line) for p in patterns)]


@pytest.mark.parametrize("decision", sorted(OWNERS))
def test_one_owner_makes_the_decision(decision: str) -> None:
    owner = OWNERS[decision][0]
    assert _makes((SRC / owner).read_text(), decision), f"{owner} no longer makes the {decision}"
    seconds = {
        f"{path.relative_to(SRC)}: {line}"
        for path in sorted(SRC.rglob("*.py"))
        if str(path.relative_to(SRC)) != owner
        for line in _makes(path.read_text(), decision)
    }
    assert sorted(seconds) == [], f"call {owner} instead"


@pytest.mark.parametrize("decision", sorted(SECOND_COPIES))
def test_the_scan_sees_a_second_copy(decision: str) -> None:
    assert all(_makes(line, decision) for line in SECOND_COPIES[decision])
