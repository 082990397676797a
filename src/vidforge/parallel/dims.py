"""ParallelDims: the runtime side of the profile's layout. It owns the DeviceMesh (built once, on first
use) and answers questions such as "is FSDP on?" so that the rest of the code never re-derives them.

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, cp, tp (tp innermost: the fastest links).
Flattened views built with it:
    dp          = dp_replicate x dp_shard        ranks that read different data
    dp_shard_cp = dp_shard x cp                  FSDP shards over cp too (cp ranks hold the same weights)
    dp_cp       = dp_replicate x dp_shard x cp   the loss is averaged over these
    mp          = pp x cp x tp                    one model-parallel group: the same samples
Sub-groups of cp for 2D context parallel (cp_impl=usp): `cp_2d_groups`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from vidforge.errors import UserInputError
from vidforge.profile.parallel import Layout


@dataclass
class ParallelDims:
    layout: Layout
    device_type: str = "cpu"
    _mesh: DeviceMesh | None = field(default=None, repr=False)
    _flat: dict[str, DeviceMesh] = field(default_factory=dict, repr=False)
    _groups: dict[str, dist.ProcessGroup] = field(default_factory=dict, repr=False)

    @classmethod
    def data_parallel(cls, world: int, device_type: str) -> ParallelDims:
        """Every rank a data-parallel FSDP shard: what a run that ignores the profile's layout (the VAE
        fine-tune) shards over."""
        return cls(Layout(pp=1, dp_replicate=1, dp_shard=world, cp=1, tp=1), device_type)

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def dp_enabled(self) -> bool:
        return self.layout.dp > 1

    @property
    def fsdp_enabled(self) -> bool:
        return self.layout.dp_shard * self.layout.cp > 1

    @property
    def hsdp_enabled(self) -> bool:
        return self.layout.dp_replicate > 1 and self.fsdp_enabled

    @property
    def tp_enabled(self) -> bool:
        return self.layout.tp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.layout.cp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.layout.pp > 1

    @cached_property
    def mesh(self) -> DeviceMesh:
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised; start the ranks with --nproc or torchrun and call "
                "vidforge.parallel.runtime.init_runtime"
            )
        if dist.get_world_size() != self.world_size:
            raise RuntimeError(
                f"the layout {self.layout.describe()} needs {self.world_size} ranks, but {dist.get_world_size()} "
                "were started; change --nproc or the profile's cluster section"
            )
        degrees = self.layout.degrees()
        mesh = init_device_mesh(self.device_type, tuple(degrees.values()), mesh_dim_names=tuple(degrees))
        # Kept here as well: slicing a flattened dim back out of the root mesh is deprecated in torch 2.11.
        self._flat = {
            "dp": mesh["dp_replicate", "dp_shard"]._flatten("dp"),
            "dp_shard_cp": mesh["dp_shard", "cp"]._flatten("dp_shard_cp"),
            "dp_cp": mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp"),
            "mp": mesh["pp", "cp", "tp"]._flatten("mp"),
        }
        return mesh

    def flat(self, name: str) -> DeviceMesh:
        """A flattened 1-D mesh: dp, dp_shard_cp, dp_cp or mp (see the module docstring)."""
        self.mesh  # noqa: B018 - builds the mesh and the flattened views on first use
        return self._flat[name]

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one model replica between them and read the same samples: pp x cp x tp."""
        return self.layout.pp * self.layout.cp * self.layout.tp

    def model_parallel_group(self) -> dist.ProcessGroup:
        return self.flat("mp").get_group()

    def data_exchange_group(self) -> dist.ProcessGroup:
        """The model-parallel group's ranks again, in a gloo group of their own, for the loader's sample
        exchange (`data.mp_read`): it runs in the prefetch thread while the step's collectives run on the
        mesh's groups, and two threads must never issue collectives on one group (their order could differ
        between ranks). gloo: the exchanged samples are pickled host objects. Every rank calls this (new
        groups are made collectively); made once."""
        if "data" not in self._groups:
            mine = dist.get_process_group_ranks(self.model_parallel_group())
            every: list[list[int] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
            enumeration = sorted({tuple(ranks) for ranks in every if ranks is not None})
            group, _ = dist.new_subgroups_by_enumeration([list(r) for r in enumeration], backend="gloo")
            self._groups["data"] = group
        return self._groups["data"]

    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh FSDP shards over: (dp_replicate, dp_shard_cp) for HSDP, else dp_shard_cp."""
        if self.layout.dp_replicate > 1:
            return self.mesh["dp_replicate", "dp_shard_cp"]
        return self.flat("dp_shard_cp")

    def cp_2d_groups(self, ulysses: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
        """2D context parallel's sub-groups of this rank's cp group, cp = cp_ring x `ulysses`
        (parallel.cp_impl=usp): the Ulysses group, `ulysses` consecutive cp ranks (tp apart in the world:
        inside one node when tp x ulysses divides gpus_per_node), and the ring group, the cp ranks
        `ulysses` apart, one from each Ulysses group. Both list their ranks in cp order, so a rank's
        place in them is its cp rank % ulysses and // ulysses. Every rank calls this (new groups are made
        collectively); made once per degree."""
        key = f"cp_2d_{ulysses}"
        if key not in self._groups:
            inner, ring = cp_2d_ranks(self.mesh.mesh, ulysses)
            self._groups[key], _ = dist.new_subgroups_by_enumeration(inner)
            self._groups[key + "_ring"], _ = dist.new_subgroups_by_enumeration(ring)
        return self._groups[key], self._groups[key + "_ring"]


def cp_2d_ranks(ranks: torch.Tensor, ulysses: int) -> tuple[list[list[int]], list[list[int]]]:
    """Every Ulysses group and every ring group of 2D context parallel (`ParallelDims.cp_2d_groups`),
    as global ranks, from the mesh's rank tensor (dimensions `Layout.MESH_DIMS`)."""
    cp = ranks.shape[Layout.MESH_DIMS.index("cp")]
    if cp % ulysses:
        raise UserInputError(f"parallel.cp_ulysses: {ulysses} must divide parallel.cp={cp}")
    rows = ranks.movedim(Layout.MESH_DIMS.index("cp"), -1).reshape(-1, cp).tolist()  # cp groups, cp order
    inner = [row[start : start + ulysses] for row in rows for start in range(0, cp, ulysses)]
    ring = [row[offset::ulysses] for row in rows for offset in range(ulysses)]
    return inner, ring
