"""The table rows of the GPU suite, the context every step gets, and the markdown they make."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from shapes import Shapes


@dataclass
class Row:
    """One line of the table: a measured value, and the anchor it is read against (the same computation
    elsewhere: a peer library, the CPU, float32, the memory model, the VAE's own encode)."""

    step: str
    what: str
    value: float | str | None
    unit: str = ""
    anchor: str = ""
    anchor_value: float | str | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if (
            isinstance(self.value, int | float)
            and isinstance(self.anchor_value, int | float)
            and self.anchor_value
        ):
            return self.value / self.anchor_value
        return None


@dataclass
class Context:
    """What every step gets: the shapes, a scratch folder, the environment its subprocesses run in
    (LOCAL_RANK=0 so that vidforge picks its device the way a launched rank does), the part's
    deadline (a time.perf_counter() value; None: no limit), and the folder that comes back (`out`: a
    step keeps a log there only where the table's one line a row cannot say enough)."""

    shapes: Shapes
    work: Path
    smoke: bool
    env: dict[str, str] = field(default_factory=dict)
    deadline: float | None = None
    out: Path | None = None

    def time_left(self, cap: float) -> float:
        """Seconds a subprocess may run: `cap`, or less where the deadline comes first."""
        if self.deadline is None:
            return cap
        return min(cap, self.deadline - time.perf_counter())


def _fmt(value: float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/").replace("\n", " ")


def markdown(report: dict) -> str:
    lines = [
        f"GPU suite, {report['date']} on {report['device']} (torch {report['torch']}, "
        f"{'CPU smoke shapes' if report['smoke'] else 'GPU shapes'}; {report['seconds']:.0f} s)",
        "",
        "| step | what | value | unit | anchor | anchor value | ratio | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        ratio = f"{r['ratio']:.3g}" if r["ratio"] is not None else "-"
        lines.append(
            f"| {r['step']} | {_fmt(r['what'])} | {_fmt(r['value'])} | {r['unit']} | {_fmt(r['anchor'])} | "
            f"{_fmt(r['anchor_value'])} | {ratio} | {_fmt(r['note'])} |"
        )
    return "\n".join(lines) + "\n"
