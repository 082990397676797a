"""`parallel`: the 4D layout, pp × dp_replicate × dp_shard × cp × tp, tp innermost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from vidforge.section import Section

CpImpl = Literal["all-gather", "ring", "ulysses", "usp", "st-hybrid", "st-spatial"]
PpSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
SLIDING_TILE_CP_IMPLS = ("all-gather", "ring", "ulysses")
"""The cp_impl values that apply sliding-tile attention's windows (model.attention_window) across ranks."""


class Parallel(Section):
    """How the world of ranks is split. Mesh order, outermost first: pp, dp_replicate, dp_shard, cp, tp,
    so tensor parallel sits on the fastest links (inside a node)."""

    dp_replicate: int = Field(1, ge=1)
    """Data-parallel replicas (the replicate dimension of HSDP: whole copies that all-reduce gradients)."""
    dp_shard: int = Field(-1)
    """FSDP shard degree: parameters, gradients and optimizer states sharded over this many ranks.
    -1 means "whatever the other degrees leave of the world size"."""
    tp: int = Field(1, ge=1)
    """Tensor-parallel degree (Megatron column/row split of attention and MLP). Must divide model.heads."""
    sequence_parallel: bool | None = None
    """With tp > 1, also shard norms and residuals along the sequence (Megatron SP). No effect at tp = 1.
    Unset: the family's choice, on where its tensor-parallel plan has sequence parallel and the run allows
    it (not under first-frame conditioning), off otherwise (`layout_rules.sequence_parallel` decides, and
    refuses true where it cannot run)."""
    cp: int = Field(1, ge=1)
    """Context-parallel degree: the token sequence split over this many ranks."""
    cp_impl: CpImpl = "all-gather"
    """Context-parallel attention: `all-gather` of K/V (NeMo), `ring` of K/V blocks with log-sum-exp
    merging, `ulysses` all-to-all between heads and sequence, `usp` (2D: Ulysses inside groups of
    `cp_ulysses` ranks, the ring across the groups, as USP / xDiT do), or `st-hybrid` (ST-DiT: all-to-all
    between spatial and temporal layouts). `st-spatial` (ST-DiT, Vchitect-2.0): each rank holds (h, w)
    positions of every frame, so temporal attention is local and spatial (and full) attention
    head-parallel (all-to-all between positions and heads; tp x cp must divide model.heads); it takes
    images and odd frame counts, which st-hybrid's split by frames cannot."""
    cp_ulysses: int = Field(1, ge=1)
    """With cp_impl=usp: the Ulysses degree, cp = cp_ulysses x cp_ring. Each Ulysses group is cp_ulysses
    consecutive cp ranks (inside one node when tp x cp_ulysses divides cluster.gpus_per_node), so its
    all-to-alls run on the fast links and the ring of cp / cp_ulysses groups on the slow ones. Must divide
    cp, and tp x cp_ulysses must divide model.heads. Leave it 1 with the other cp_impl values."""
    cp_regather: bool = False
    """With cp_impl=all-gather: keep only this rank's K/V shard for the backward and all-gather it again
    there (NeMo / Transformer Engine), instead of keeping the gathered row: saves (cp-1)/cp of every
    full-attention layer's K/V activations for one more all-gather per layer in the backward."""
    pp: int = Field(1, ge=1)
    """Pipeline-parallel degree: the blocks split into this many stages."""
    vpp: int = Field(1, ge=1)
    """Virtual stages per pipeline rank (interleaved 1F1B); pp × vpp must divide model.layers."""
    pp_schedule: PpSchedule = "1f1b"
    """Pipeline schedule: `gpipe`, `1f1b`, or `interleaved-1f1b` (needs vpp > 1)."""
    pp_microbatches: int = Field(0, ge=0)
    """Micro-batches per step through the pipeline; 0 means pp × vpp, the fewest that keep every stage busy."""

    @model_validator(mode="after")
    def _check(self) -> Parallel:
        if self.dp_shard == 0 or self.dp_shard < -1:
            raise ValueError(
                f"dp_shard: must be >= 1, or -1 for the rest of the world size, got {self.dp_shard}"
            )
        if self.cp_ulysses > 1 and self.cp_impl != "usp":
            raise ValueError(
                f"cp_ulysses: {self.cp_ulysses} is the Ulysses degree of cp_impl=usp, but cp_impl is "
                f"{self.cp_impl}; set cp_impl=usp or cp_ulysses=1"
            )
        return self

    def resolve(self, world_size: int) -> Layout:
        """The concrete degrees for a world size. Raises ValueError naming the fields when they don't fit."""
        fixed = self.pp * self.dp_replicate * self.cp * self.tp
        fixed_desc = f"pp={self.pp} x dp_replicate={self.dp_replicate} x cp={self.cp} x tp={self.tp}"
        if self.dp_shard == -1:
            if world_size % fixed:
                raise ValueError(
                    f"{fixed_desc} = {fixed} does not divide the world size {world_size}; change the degrees"
                )
            dp_shard = world_size // fixed
        else:
            dp_shard = self.dp_shard
            if fixed * dp_shard != world_size:
                raise ValueError(
                    f"{fixed_desc} x dp_shard={dp_shard} = {fixed * dp_shard}, but the world size is {world_size}; "
                    f"set dp_shard to -1 or make the product equal {world_size}"
                )
        microbatches = self.pp_microbatches or self.pp * self.vpp
        return Layout(self.pp, self.dp_replicate, dp_shard, self.cp, self.tp, self.vpp, microbatches)

    @property
    def token_slicing(self) -> str:
        """How a context-parallel rank's `TokenShard` cuts each sample: `positions` (whole (h, w) position
        columns of every frame) for cp_impl=st-spatial, contiguous `chunks` for the others."""
        return "positions" if self.cp_impl == "st-spatial" else "chunks"


@dataclass(frozen=True)
class Layout:
    """Resolved degrees, no -1 left. The runtime mesh is built from this."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    vpp: int = 1
    pp_microbatches: int = 1

    MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Ranks that see different data."""
        return self.dp_replicate * self.dp_shard

    def degrees(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.MESH_DIMS}

    def describe(self) -> str:
        active = [f"{n.upper()}{d}" for n, d in self.degrees().items() if d > 1]
        return "x".join(active) if active else "single rank"
