"""`vidforge bench sweep`: `vidforge bench train` over a grid of profile fields, each point in a fresh
process (so one point's memory, threads and compiled code cannot leak into the next), results to
sweep.csv, sweep.json and a plot.

    --grid parallel.dp_shard=1,2 --grid bench.latent_frames=4,8,16

runs the 6 combinations; a point whose layout needs several ranks runs under `--nproc` (torchrun).
A point that fails (an invalid layout, out of memory) is recorded with its error; the sweep goes on."""

from __future__ import annotations

import csv
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidforge.errors import UserInputError
from vidforge.files import atomic_file, write_text
from vidforge.profile import load_profile

CSV_FIELDS = (
    "point",
    "ok",
    "layout",
    "world_size",
    "tokens_per_sample",
    "tokens_per_step",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "peak_memory_gib",
    "predicted_memory_gib",
    "error",
)


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`section.field=v1,v2,...` per item -> [(field path, [values])]."""
    grid = []
    for item in items:
        key, sep, raw = item.partition("=")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or "." not in key or not values:
            raise UserInputError(
                f"--grid {item!r}: expected section.field=v1,v2,..., e.g. --grid parallel.dp_shard=1,2"
            )
        grid.append((key.strip(), values))
    if not grid:
        raise UserInputError("bench sweep: give at least one --grid section.field=v1,v2")
    return grid


def grid_points(grid: Sequence[tuple[str, list[str]]]) -> list[list[str]]:
    """Every combination, as `--set` items: the last --grid varies fastest."""
    keys = [k for k, _ in grid]
    return [
        [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
        for combo in itertools.product(*(v for _, v in grid))
    ]


@dataclass
class SweepResult:
    grid: list[tuple[str, list[str]]]
    rows: list[dict[str, Any]] = field(default_factory=list)
    csv_path: str = ""
    json_path: str = ""
    plot_path: str | None = None
    plot_note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "grid": [{"field": k, "values": v} for k, v in self.grid],
            "points": len(self.rows),
            "failed": sum(not r["ok"] for r in self.rows),
            "csv": self.csv_path,
            "json": self.json_path,
            "plot": self.plot_path,
            "plot_note": self.plot_note,
            "rows": self.rows,
        }


def _command(profile: str | None, sets: Sequence[str], nproc: int) -> list[str]:
    cmd = [sys.executable, "-m", "vidforge.cli.app", "--json", "bench", "train"]
    if profile is not None:
        cmd += ["--profile", str(profile)]
    for item in sets:
        cmd += ["--set", item]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    return cmd


def _last_event(stdout: str, kind: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("event") == kind:
                return obj
    return None


def run_point(profile: str | None, sets: Sequence[str], timeout: float) -> dict[str, Any]:
    """One `vidforge bench train` in a fresh process; its result, or the error it ended with."""
    point = " ".join(s for s in sets)
    row: dict[str, Any] = {"point": point, "ok": False, "sets": list(sets)}
    try:
        resolved = load_profile(profile, sets)
    except UserInputError as err:
        return {**row, "error": str(err)}
    nproc = resolved.layout.world_size
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        proc = subprocess.run(
            _command(profile, sets, nproc), capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {timeout:g} s"}
    result = _last_event(proc.stdout, "result")
    if proc.returncode != 0 or result is None:
        error = _last_event(proc.stdout, "error")
        message = error["message"] if error else (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**row, "error": f"exit {proc.returncode}: {message}"}
    result.pop("event", None)
    return {**row, **result, "ok": True}


def run(
    profile: str | None,
    base_sets: Sequence[str],
    grid_items: Sequence[str],
    out_dir: str | Path,
    *,
    timeout: float = 600.0,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> SweepResult:
    from vidforge.bench.plots import plot_sweep

    grid = parse_grid(grid_items)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = SweepResult(grid)
    for sets in grid_points(grid):
        row = run_point(profile, [*base_sets, *sets], timeout)
        row["point"] = " ".join(sets)
        for key, value in zip((k for k, _ in grid), (s.partition("=")[2] for s in sets), strict=True):
            row[key] = value
        result.rows.append(row)
        if progress is not None:
            progress(row)
    keys = [k for k, _ in grid]
    result.csv_path = str(out / "sweep.csv")
    with atomic_file(result.csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=[*keys, *CSV_FIELDS], extrasaction="ignore")
        writer.writeheader()
        for row in result.rows:
            writer.writerow({k: row.get(k) for k in [*keys, *CSV_FIELDS]})
    result.json_path = str(out / "sweep.json")
    write_text(result.json_path, json.dumps(result.as_dict(), indent=2, default=str))
    result.plot_path, result.plot_note = plot_sweep(result.rows, keys, out / "sweep.png")
    write_text(result.json_path, json.dumps(result.as_dict(), indent=2, default=str))
    return result
