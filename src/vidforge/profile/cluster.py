"""`cluster`: the machines a run uses: how many, which accelerator, how fast they talk."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.section import Section

# Dense bf16 peak (no sparsity; tensor cores with float32 accumulation) and memory of the accelerators we
# plan for, from the vendors' datasheets (the data-centre GPUs in their SXM form); MFU is measured against
# these. Memory is the card's nominal size in GiB: the plan keeps bench.memory_headroom of it free for
# the CUDA context, the allocator's fragmentation and the kernels' workspaces.
KNOWN_ACCELERATORS: dict[str, dict[str, float | str]] = {
    # consumer and workstation cards (Ada and Blackwell GeForce: bf16 with float32 accumulation runs at
    # half the float16-accumulate rate the box quotes)
    "rtx4090": {"kind": "cuda", "peak_bf16_flops": 165.2e12, "memory_gib": 24.0},
    "rtx5090": {"kind": "cuda", "peak_bf16_flops": 209.5e12, "memory_gib": 32.0},
    "l40s": {"kind": "cuda", "peak_bf16_flops": 362e12, "memory_gib": 48.0},
    # data centre
    "a100-40gb": {"kind": "cuda", "peak_bf16_flops": 312e12, "memory_gib": 40.0},
    "a100": {"kind": "cuda", "peak_bf16_flops": 312e12, "memory_gib": 80.0},
    "a100-80gb": {"kind": "cuda", "peak_bf16_flops": 312e12, "memory_gib": 80.0},
    "h100": {"kind": "cuda", "peak_bf16_flops": 989e12, "memory_gib": 80.0},
    "h200": {"kind": "cuda", "peak_bf16_flops": 989e12, "memory_gib": 141.0},
    "b200": {"kind": "cuda", "peak_bf16_flops": 2250e12, "memory_gib": 180.0},
    # A nominal figure for a laptop-class CPU; only used so that MFU prints something on CPU runs.
    "cpu": {"kind": "cpu", "peak_bf16_flops": 1e12, "memory_gib": 24.0},
}


class Accelerator(Section):
    """One device of the cluster. In YAML either a known name (`rtx4090`, `rtx5090`, `l40s`, `a100-40gb`,
    `a100` = `a100-80gb`, `h100`, `h200`, `b200`, `cpu`) or a mapping with every field."""

    name: str = "cpu"
    """Label used in reports and to pick defaults."""
    kind: Literal["cuda", "cpu"] = "cpu"
    """Device type torch runs on: `cuda` for GPUs, `cpu` for CPU processes (gloo)."""
    peak_bf16_flops: float = Field(1e12, gt=0)
    """Dense bf16 peak of one device in FLOP/s (989e12 for an H100/H200 SXM); the MFU denominator."""
    memory_gib: float = Field(24.0, gt=0)
    """Memory of one device in GiB; memory plans are checked against it."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: object) -> object:
        if isinstance(value, str):
            if value not in KNOWN_ACCELERATORS:
                raise ValueError(
                    f"unknown accelerator {value!r}; use one of {sorted(KNOWN_ACCELERATORS)} or a mapping"
                )
            return {"name": value, **KNOWN_ACCELERATORS[value]}
        return value


class Cluster(Section):
    """The cluster topology. The world size (number of ranks) is nodes × gpus_per_node on GPUs, or
    nodes × cpu_processes on CPU."""

    nodes: int = Field(1, ge=1)
    """Number of machines."""
    gpus_per_node: int = Field(8, ge=1)
    """Accelerators per machine (GPU clusters). Ignored when the accelerator kind is `cpu`."""
    cpu_processes: int = Field(1, ge=1)
    """Processes per machine when the accelerator kind is `cpu` (distributed tests on gloo)."""
    accelerator: Accelerator = Accelerator()
    """The device every rank drives."""
    intra_node_bandwidth_gbs: float = Field(450.0, gt=0)
    """Per-device unidirectional bandwidth inside a node in GB/s (NVLink 4 on H100: 450)."""
    inter_node_bandwidth_gbs: float = Field(50.0, gt=0)
    """Per-device unidirectional bandwidth between nodes in GB/s (one 400 Gb/s NIC per GPU: 50)."""
    host_bandwidth_gbs: float = Field(25.0, gt=0)
    """Host-to-device copy bandwidth per device in GB/s (PCIe 4.0 x16 moves about 25 GB/s from pinned
    memory); what block swap's copies take (`vidforge bench plan --fit`)."""
    host_memory_gib: float = Field(128.0, gt=0)
    """Host memory of one machine in GiB: `bench plan --fit` keeps what its recipes pin there (offloaded
    activations, swapped weights, for every GPU of the machine) within bench.memory_headroom of it."""
    launcher: Literal["local", "torchrun", "slurm"] = "local"
    """How this profile's ranks are started: `local` (`--nproc N` starts them on this machine), `torchrun`
    (one torchrun per node) or `slurm` (srun, one task per device: commands/train-slurm.sbatch). A rank
    learns how it was started from its environment (torchrun's or SLURM's variables), so this does not
    change a run; it is the command `train` and `bench train` name when they find another number of
    ranks than the layout's (`vidforge.parallel.launch.start_advice`): a 64-GPU profile started by hand
    on a login node answers with the sbatch line, not `--nproc 64`. Kept rather than removed because
    the profile is where the cluster is described."""

    @property
    def devices_per_node(self) -> int:
        return self.cpu_processes if self.accelerator.kind == "cpu" else self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def world_size_field(self) -> str:
        """How the world size was computed, for error messages."""
        per = "cpu_processes" if self.accelerator.kind == "cpu" else "gpus_per_node"
        return f"cluster.nodes={self.nodes} x cluster.{per}={self.devices_per_node}"
