"""Two shape rules of the source tree (docs/design.md, "Layout"): a function does one job (none
over 150 lines: a longer one is several, and gets split by job), and curate/ keeps its modules in rooms by
job (decode and clipping, scorers and filters, captioning, embeddings and dedup, executors), at most 12
modules at its top."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"
LONGEST = 150
CURATE_TOP = 12


def test_no_function_is_longer_than_150_lines():
    long = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split by job: " + "; ".join(long)


def test_curate_keeps_its_modules_in_rooms():
    top = sorted(p.name for p in (SRC / "curate").glob("*.py"))
    assert len(top) <= CURATE_TOP, f"{len(top)} modules at curate/'s top: {top}"
    rooms = {p.name for p in (SRC / "curate").iterdir() if (p / "__init__.py").is_file()}
    assert {"clipping", "scorers", "filters", "captioning", "embeddings", "executors"} <= rooms
