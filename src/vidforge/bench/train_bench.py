"""`vidforge bench train`: step time, tokens/s, MFU and memory of the training step on synthetic latents.

The step is the training loop's own parts: `build_model`, `vidforge.parallel.parallelize.parallelize`
(TP/SP, CP, activation checkpointing and offload, compile, FSDP2, in the loop's order),
`micro_batch_loss` with the profile's EDM (and the CP group), the loop's gradient clipping, AdamW, EMA.
Pipeline parallel is refused: its schedule is the loop's `PipelineTrainer`, not one module's step.
Only the data differ: random latents of `bench.latent_*` and random caption embeddings (packed into one
row when `data.packing` is on, as the loader packs), so no shards are needed and every step has the
same shape. Warm-up steps first, then the median of `bench.repeats` steps (CUDA events on GPU).

Memory: on CUDA the allocator's peak; on CPU (no allocator statistics) what the step holds, measured
from the tensors (`vidforge.bench.measure`): local parameter, gradient, optimizer and EMA shards after a
step, and the bytes autograd saved during a forward. Both are reported beside the analytic model's
prediction (`vidforge.bench.memory_model`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from vidforge.bench.measure import saved_activations, state_bytes
from vidforge.bench.memory_model import GIB, estimate_memory
from vidforge.bench.timing import time_calls
from vidforge.bench.workload import Workload
from vidforge.data.packing import BucketBatch, PackedBatch
from vidforge.diffusion import EDM
from vidforge.errors import UserInputError
from vidforge.models import build_model, pack_latents, train_step_flops
from vidforge.parallel.dims import ParallelDims, profile_device
from vidforge.profile import RunProfile
from vidforge.train.ema import EMA
from vidforge.train.step import MicroLoss, micro_batch_loss


def synthetic_batch(profile: RunProfile, workload: Workload, seed: int = 0) -> BucketBatch | PackedBatch:
    """Random latents and caption embeddings (N, L, text_dim), every caption token real: a plain batch
    (N, C, T, H, W), or the N clips packed into one row (what the loader gives with data.packing)."""
    g = torch.Generator().manual_seed(seed)
    n = workload.samples
    latents = torch.randn((n, *workload.latent), generator=g)
    text = torch.randn((n, workload.text_tokens, profile.model.text_dim), generator=g)
    mask = torch.ones(n, workload.text_tokens, dtype=torch.bool)
    keys = [f"synthetic-{i}" for i in range(n)]
    if not workload.packed:
        return BucketBatch(latents, text, mask, keys, [{}] * n)
    tokens, layout = pack_latents(list(latents), profile.model.patch)
    shapes = [tuple(x.shape) for x in latents]
    return PackedBatch(tokens, layout, text, mask, keys, shapes, layout.total, [{}] * n)


class TrainStep:
    """The training step of `vidforge train` on a fixed synthetic batch. Call it for a whole step, or
    `forward`, `backward`, `update`, `zero_grad` one by one to look in between."""

    def __init__(self, profile: RunProfile, device: torch.device | None = None) -> None:
        from vidforge.parallel.parallelize import parallelize

        cfg = profile.train
        self.profile = profile
        self.device = device or profile_device(profile)
        self.dims = ParallelDims.from_profile(profile)
        if self.dims.pp_enabled:
            raise UserInputError(
                "parallel.pp: bench train times one module's step and does not run the pipeline schedule; "
                "keep pp=1 here (time pipelines with `vidforge train`) and use `vidforge bench plan` for them"
            )
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world != self.dims.world_size:
            raise UserInputError(
                f"the layout {self.dims.layout.describe()} needs {self.dims.world_size} rank(s) but {world} "
                f"started; use --nproc {self.dims.world_size} or change cluster/parallel in the profile"
            )
        self.workload = Workload.from_profile(profile)
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank, as in the loop
        self.model = build_model(profile.model, device=self.device)
        # The loop's own parallelization: TP/SP, CP, checkpointing, offload, compile, FSDP2 in its order.
        self.autocast_dtype = parallelize(self.model, self.dims, profile, self.device).autocast_dtype
        self.cp_group = self.dims.mesh["cp"].get_group() if self.dims.cp_enabled else None
        self.ema = EMA(self.model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=self.device.type == "cuda" or None,
        )
        self.edm = EDM.from_profile(profile.diffusion)
        self.batch = synthetic_batch(profile, self.workload, seed=cfg.seed)
        self.model.train()

    def forward(self) -> MicroLoss:
        return micro_batch_loss(
            self.model,
            self.edm,
            self.batch,
            self.profile.diffusion.caption_dropout,
            self.device,
            self.autocast_dtype,
            self.cp_group,
        )

    def backward(self, micro: MicroLoss) -> None:
        # As the loop: under CP each rank's loss is its share and FSDP averages over dp_shard x cp.
        (micro.loss * self.dims.layout.cp / self.profile.train.grad_accum).backward()

    def update(self) -> None:
        clip = self.profile.train.grad_clip or math.inf
        if self.dims.tp_enabled:  # parameters on several meshes: the loop's mesh-aware clip
            from vidforge.parallel.tensor_parallel import clip_grad_norm_

            clip_grad_norm_(self.model.parameters(), clip)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update(self.model)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def __call__(self) -> None:
        for _ in range(self.profile.train.grad_accum):
            self.backward(self.forward())
        self.update()
        self.zero_grad()

    def flops(self) -> int:
        """Model FLOPs of one step on this rank (grad_accum micro-batches)."""
        w = self.workload
        recompute = "full" if self.profile.train.activation_checkpointing == "full" else "none"
        per_micro = train_step_flops(self.profile.model, [w.grid] * w.samples, w.text_tokens, recompute)
        return per_micro * self.profile.train.grad_accum

    def measure_memory(self) -> dict[str, int]:
        """One more step, measured: saved activations after the forward, states after the update."""
        self.zero_grad()
        with saved_activations(self.model) as saved:
            micro = self.forward()
        activations = saved.bytes
        self.backward(micro)
        self.update()
        out = {**state_bytes(self.model, self.optimizer, self.ema), "activations": activations}
        self.zero_grad()
        return out


@dataclass
class TrainBenchResult:
    profile: str
    layout: str
    world_size: int
    device: str
    workload: str
    tokens_per_sample: int
    tokens_per_step: int
    step_time_s: float
    step_time_spread: float
    tokens_per_s: float
    mfu: float
    flops_per_step: float
    peak_memory_gib: float
    peak_memory_method: str
    predicted_memory_gib: float
    predicted_measured_terms_gib: float
    """The prediction restricted to what the measurement covers: on CPU the transient terms (FSDP
    all-gather/reduce-scatter buffers, the backward's recompute) are not measured, so they are left out."""
    measured_memory: dict[str, int] = field(default_factory=dict)
    predicted_memory: dict[str, float] = field(default_factory=dict)
    step_times_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slowest_rank(seconds: float, device: torch.device) -> float:
    """Every rank timed the same steps; a step is as slow as its slowest rank."""
    if not dist.is_initialized():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run(profile: RunProfile) -> TrainBenchResult:
    """Time the step of `profile` (every rank runs this; rank 0's result is the one to report)."""
    step = TrainStep(profile)
    device = step.device
    world = step.dims.world_size
    bench = profile.bench
    timing = time_calls(step, bench.warmup, bench.repeats, device)
    step_time = _slowest_rank(timing.median, device)
    tokens = step.workload.tokens * profile.train.grad_accum * step.dims.layout.dp
    flops = step.flops() * step.dims.layout.dp
    peak = profile.cluster.accelerator.peak_bf16_flops
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        step()
        peak_bytes = torch.cuda.max_memory_allocated(device)
        method = "torch.cuda.max_memory_allocated over one step"
        measured: dict[str, int] = {}
    else:
        measured = step.measure_memory()
        peak_bytes = sum(measured.values())
        method = "CPU: local parameter/gradient/optimizer/EMA shards + bytes autograd saved in a forward"
    predicted = estimate_memory(profile, step.dims.layout, step.workload)
    measured_terms = ("parameters", "gradients", "optimizer", "ema", "activations", "weight copies")
    comparable = sum(predicted.get(name) for name in measured_terms)
    return TrainBenchResult(
        profile=profile.name,
        layout=step.dims.layout.describe(),
        world_size=world,
        device=str(device),
        workload=step.workload.describe(),
        tokens_per_sample=step.workload.tokens_per_sample,
        tokens_per_step=tokens,
        step_time_s=step_time,
        step_time_spread=timing.spread,
        tokens_per_s=tokens / step_time,
        mfu=flops / (step_time * world * peak),
        flops_per_step=float(flops),
        peak_memory_gib=peak_bytes / GIB,
        peak_memory_method=method,
        predicted_memory_gib=predicted.total / GIB,
        predicted_measured_terms_gib=(predicted.total if device.type == "cuda" else comparable) / GIB,
        measured_memory=measured,
        predicted_memory={t.name: predicted.get(t.name) for t in predicted.terms},
        step_times_s=list(timing.samples),
    )
