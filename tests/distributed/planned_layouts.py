"""What `vidforge bench plan --rank` proposes for the NeMo profiles, in miniature: each ranked layout
reduced to its shape (which of pp, dp_replicate, dp_shard, cp, tp exceed 1, with the profile's cp_impl
and pp_schedule where they apply), and that shape given degree 2 in each of those dimensions, to train
the tiny model on at most MAX_RANKS CPU processes. A shape of more than MAX_RANKS ranks drops its
data-parallel dimensions, dp_replicate first (they add gradient reductions over more copies, not a new
way of splitting the model). The planner asks the layout rulebook, so a layout the trainer learns (say
pp x cp) shows up here by itself once the rulebook stops refusing it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from vidforge.bench.plan import rank_layouts
from vidforge.profile import load_profile
from vidforge.profile.loading import SHIPPED_DIR
from vidforge.profile.parallel import Layout

MAX_RANKS = 8
# The NeMo paper's model sizes, every context and cluster a shipped profile gives them.
NEMO_PROFILES = tuple(
    p.stem for p in sorted(SHIPPED_DIR.glob("dit*.yaml")) if p.stem.startswith(("dit7b_", "dit28b_"))
)


@dataclass(frozen=True)
class Miniature:
    degrees: tuple[int, ...]  # in Layout.MESH_DIMS order, 1 or 2
    cp_impl: str | None = None  # with cp > 1
    pp_schedule: str | None = None  # with pp > 1

    @property
    def ranks(self) -> int:
        return math.prod(self.degrees)

    @property
    def pipelined(self) -> bool:
        return self.degrees[0] > 1

    @property
    def name(self) -> str:
        dims = "x".join(f"{d}{n}" for d, n in zip(Layout.MESH_DIMS, self.degrees, strict=True) if n > 1)
        return "-".join(part for part in (dims, self.cp_impl, self.pp_schedule) if part)

    def sets(self) -> list[str]:
        """The profile overrides of this layout (pipeline micro-batches are the caller's to add)."""
        out = [f"parallel.{d}={n}" for d, n in zip(Layout.MESH_DIMS, self.degrees, strict=True)]
        if self.cp_impl:
            out.append(f"parallel.cp_impl={self.cp_impl}")
        if self.pp_schedule:
            out.append(f"parallel.pp_schedule={self.pp_schedule}")
        return out

    @classmethod
    def of(cls, layout: Layout, cp_impl: str, pp_schedule: str) -> Miniature:
        if layout.vpp > 1:
            raise ValueError(f"{layout}: virtual stages need a deeper tiny model; give them a miniature")
        degrees = dict.fromkeys(Layout.MESH_DIMS, 1) | {
            d: 2 for d in Layout.MESH_DIMS if getattr(layout, d) > 1
        }
        for dim in ("dp_replicate", "dp_shard"):
            if math.prod(degrees.values()) > MAX_RANKS:
                degrees[dim] = 1
        return cls(
            tuple(degrees.values()),
            cp_impl if degrees["cp"] > 1 else None,
            pp_schedule if degrees["pp"] > 1 else None,
        )

    @classmethod
    def of_sets(cls, ranks: int, sets: list[str]) -> Miniature:
        """The shape a training-layout test's overrides give on `ranks` processes (dp_shard the rest)."""
        fields = dict(s.split("=", 1) for s in sets if s.startswith("parallel."))
        given = {d: int(fields.get(f"parallel.{d}", 1)) for d in Layout.MESH_DIMS if d != "dp_shard"}
        given["dp_shard"] = ranks // math.prod(given.values())
        layout = Layout(**given)
        return cls.of(
            layout,
            fields.get("parallel.cp_impl", "all-gather"),
            fields.get("parallel.pp_schedule", "1f1b"),
        )


@cache
def planned_miniatures() -> dict[Miniature, int]:
    """Every shape the planner ranks valid for the NeMo profiles -> its best place in any ranking (0 =
    some profile's first choice), best first."""
    best: dict[Miniature, int] = {}
    for name in NEMO_PROFILES:
        profile = load_profile(name)
        for place, plan in enumerate(rank_layouts(profile).ranked):
            mini = Miniature.of(plan.layout, profile.parallel.cp_impl, profile.parallel.pp_schedule)
            best[mini] = min(place, best.get(mini, place))
    return dict(sorted(best.items(), key=lambda item: (item[1], item[0].ranks, item[0].name)))
