"""`vidforge bench train`: step time, tokens/s, MFU and memory of the training step on synthetic latents.

The step is `vidforge train`'s own: `vidforge.train.build.build` (model, pipeline split, parallelize,
EMA, AdamW) and its `TrainStep` (the loss, forward and backward of every micro-batch or the pipeline
schedule, clipping, the update). Only the data differ: random latents of `bench.latent_*` and random
caption embeddings (packed into one row when `data.packing` is on, as the loader packs), so no shards
are needed and every step has the same shape. Warm-up steps first, then the median of `bench.repeats`
steps (CUDA events on GPU).

Memory: on CUDA the allocator's peak; on CPU (no allocator statistics) what the step holds, measured
from the tensors (`vidforge.bench.measure`): local parameter, gradient, optimizer and EMA shards after a
step, and the bytes autograd saved during a forward (not under pipeline parallel, whose forwards and
backwards interleave). Both are reported beside the analytic model's prediction
(`vidforge.estimate.memory_model`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from vidforge.bench.measure import saved_activations, state_bytes
from vidforge.bench.timing import slowest_rank, time_calls
from vidforge.data.batching import BucketBatch, PackedBatch
from vidforge.errors import UserInputError
from vidforge.estimate.memory_model import GIB, estimate_memory
from vidforge.estimate.workload import Workload
from vidforge.models import forward_flops, pack_latents
from vidforge.parallel.runtime import init_runtime
from vidforge.profile import RunProfile
from vidforge.train.build import build
from vidforge.train.make_step import make_train_step
from vidforge.train.step import LocalTrainStep, TrainStep


def synthetic_batch(profile: RunProfile, workload: Workload, seed: int = 0) -> BucketBatch | PackedBatch:
    """Random latents and caption embeddings (N, L, text_dim), every caption token real: a plain batch
    (N, C, T, H, W), or the N clips packed into one row (what the loader gives with data.packing). An
    image-to-video model's batch also has random condition latents (model.condition_channels) and image
    embeddings (N, workload.image_tokens, model.image_dim)."""
    model = profile.model
    g = torch.Generator().manual_seed(seed)
    n = workload.samples
    latents = torch.randn((n, *workload.latent), generator=g)
    text = torch.randn((n, workload.text_tokens, model.text_dim), generator=g)
    mask = torch.ones(n, workload.text_tokens, dtype=torch.bool)
    keys = [f"synthetic-{i}" for i in range(n)]
    condition = image = None
    if model.condition_channels:
        condition = torch.randn((n, model.condition_channels, *workload.latent[1:]), generator=g)
    if model.image_dim:
        image = torch.randn((n, workload.image_tokens, model.image_dim), generator=g)
    if not workload.packed:
        return BucketBatch(latents, text, mask, keys, [{}] * n, condition, image)
    tokens, layout = pack_latents(list(latents), model.patch)
    if condition is not None:
        condition = pack_latents(list(condition), model.patch)[0]
    shapes = [tuple(x.shape) for x in latents]
    return PackedBatch(tokens, layout, text, mask, keys, shapes, layout.total, [{}] * n, condition, image)


class SyntheticSource:
    """The same synthetic batch every time it is asked (what `TrainStep.next_batches` reads)."""

    def __init__(self, batch: BucketBatch | PackedBatch) -> None:
        self.batch = batch

    def next_batch(self) -> BucketBatch | PackedBatch:
        return self.batch


class BenchStep:
    """`vidforge train`'s step on a fixed synthetic batch; calling it runs one whole step."""

    def __init__(self, profile: RunProfile) -> None:
        from vidforge.estimate.recompute import resolve_auto

        profile, _ = resolve_auto(profile)  # train.activation_checkpointing=auto: the memory model's mix
        self.profile = profile
        self.runtime = init_runtime(profile)
        self.runtime.require_layout(profile.cluster)
        self.device = self.runtime.device
        self.dims = self.runtime.dims
        self.workload = Workload.from_profile(profile)
        self.parts = build(profile, self.runtime)
        self.step: TrainStep = make_train_step(profile, self.runtime, self.parts)
        source = SyntheticSource(synthetic_batch(profile, self.workload, seed=profile.train.seed))
        batches = self.step.next_batches(source)
        if batches is None:
            raise UserInputError(
                f"bench.latent_*: a synthetic batch of {self.workload.samples} sample(s) does not split "
                f"into {self.dims.layout.pp_microbatches} pipeline micro-batches; change train.micro_batch"
            )
        self.batches = batches
        for module in self.parts.modules:
            module.train()

    def __call__(self) -> None:
        self._run(self.batches)

    def _run(self, batches: list) -> None:
        self.step(batches)
        self.step.apply()

    def time_data(self, data: Sequence[str], steps: int) -> tuple[list[float], list[float]]:
        """Each of `steps` steps (after `bench.warmup`) on batches read from `data` by `vidforge train`'s
        own loader (`rank_batcher`: buckets, packing, `data.prefetch`): (step seconds, seconds waited for
        the batches). The synthetic timing says what the model costs; this says whether the data keeps up."""
        from vidforge.data.prefetch import Prefetcher
        from vidforge.train.loop import rank_batcher

        batcher = rank_batcher(self.profile, self.runtime, data)
        totals, waits = [], []
        try:
            for i in range(self.profile.bench.warmup + steps):
                started = time.perf_counter()
                batches = self.step.next_batches(batcher)
                fetched = time.perf_counter()
                if batches is None:
                    raise UserInputError(
                        f"--data: the shards ran out after {i} step(s) of {self.profile.bench.warmup + steps}; "
                        "give more data, raise data.epochs, or lower bench.repeats"
                    )
                self._run(batches)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                if i >= self.profile.bench.warmup:
                    totals.append(time.perf_counter() - started)
                    waits.append(fetched - started)
        finally:
            if isinstance(batcher, Prefetcher):
                batcher.close()
        return totals, waits

    def flops(self) -> tuple[float, float]:
        """Model and hardware FLOPs of one step on this rank (every micro-batch)."""
        model, hardware = zip(*map(self.step.flops, self.batches), strict=True)
        return sum(model), sum(hardware)

    def measure_memory(self) -> dict[str, int]:
        """One more step, measured: saved activations during the first micro-batch's forward (one
        module's step only), then parameters, gradients, optimizer and EMA states after the update."""
        self.step.zero_grad()
        activations = 0
        if isinstance(self.step, LocalTrainStep):
            with saved_activations(self.parts.modules[0]) as saved:
                micro = self.step.forward(self.batches[0])
            activations = saved.bytes
            self.step.backward(micro)
            if len(self.batches) > 1:
                self.step.forward_backward(self.batches[1:])
            self.step.clip_grad_norm_(self.profile.train.grad_clip or float("inf"))
        else:
            self.step(self.batches)
        self.step.apply(zero_grad=False)
        out = {"activations": activations}
        for module, optimizer in zip(self.parts.modules, self.parts.optimizers, strict=True):
            for name, value in state_bytes(module, optimizer).items():
                out[name] = out.get(name, 0) + value
        if self.parts.ema is not None:
            out["ema"] = state_bytes(self.parts.modules[0], None, self.parts.ema)["ema"]
        self.step.zero_grad()
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
    """Model FLOPs (no recompute) per second over the peak."""
    hfu: float
    """Hardware FLOPs (with the recomputed forwards of activation checkpointing) per second over the peak."""
    flops_per_step: float
    skipped_attention_flops_per_step: float
    """Attention FLOPs sliding-tile or video sparse attention (model.attention_window, attention_topk)
    skipped this step, forward and backward (not in flops_per_step); 0 without them."""
    peak_memory_gib: float
    peak_memory_method: str
    predicted_memory_gib: float
    predicted_measured_terms_gib: float
    """The prediction restricted to what the measurement covers: on CPU the transient terms (FSDP
    all-gather/reduce-scatter buffers, the backward's recompute) are not measured, so they are left out."""
    measured_memory: dict[str, int] = field(default_factory=dict)
    predicted_memory: dict[str, float] = field(default_factory=dict)
    step_times_s: list[float] = field(default_factory=list)
    recompute: str = ""
    """The activation recompute the step ran (auto's mix resolved): blocks in full, at op level, kept."""
    data: str | None = None
    """With `--data`: the shards the real-data steps read."""
    data_step_time_s: float | None = None
    """Median step time on the real batches, their wait included."""
    data_wait_s: float | None = None
    """Mean time a real-data step waited for its batches (`data_wait_s` of metrics.jsonl)."""
    data_wait_fraction: float | None = None
    """data_wait_s over the mean real-data step time: the share of the step spent waiting for data."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recompute_mix(profile: RunProfile) -> str:
    """How many blocks recompute in full, at op level, and none (`block_policies` of the profile)."""
    from vidforge.memory_savers.activation_checkpoint import block_policies

    train = profile.train
    policies = block_policies(
        profile.model.layers,
        train.activation_checkpointing,
        train.checkpoint_ratio,
        train.checkpoint_ops_ratio,
    )
    return ", ".join(f"{policies.count(p)} {p}" for p in ("full", "ops", "none") if p in policies)


def run(profile: RunProfile, data: Sequence[str] | None = None) -> TrainBenchResult:
    """Time the step of `profile` (every rank runs this; rank 0's result is the one to report); with
    `data` (shard folders or URLs), also `bench.repeats` steps on real batches, timing their wait."""
    step = BenchStep(profile)
    profile = step.profile  # train.activation_checkpointing=auto resolved to the mix that runs
    device = step.device
    world = step.dims.world_size
    bench = profile.bench
    timing = time_calls(step, bench.warmup, bench.repeats, device)
    step_time = slowest_rank(timing.median, device)
    tokens = step.workload.tokens * len(step.batches) * step.dims.layout.dp
    flops, hardware_flops = (f * step.dims.layout.dp for f in step.flops())
    work = step.workload
    count = forward_flops(profile.model, [work.grid] * work.samples, work.text_tokens, work.image_tokens)
    skipped = 3 * count.skipped_attention
    skipped *= len(step.batches) * step.dims.layout.dp
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
        if step.parts.pipeline is not None:
            method = "CPU: local parameter/gradient/optimizer/EMA shards (activations not measured under pp)"
    real: dict[str, Any] = {}
    if data:
        totals, waits = step.time_data(data, bench.repeats)
        wait = slowest_rank(statistics.fmean(waits), device)
        real = {
            "data": ", ".join(map(str, data)),
            "data_step_time_s": slowest_rank(statistics.median(totals), device),
            "data_wait_s": wait,
            "data_wait_fraction": wait / statistics.fmean(totals),
        }
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
        recompute=recompute_mix(profile),
        tokens_per_s=tokens / step_time,
        mfu=flops / (step_time * world * peak),
        hfu=hardware_flops / (step_time * world * peak),
        flops_per_step=float(flops),
        skipped_attention_flops_per_step=float(skipped),
        peak_memory_gib=peak_bytes / GIB,
        peak_memory_method=method,
        predicted_memory_gib=predicted.total / GIB,
        predicted_measured_terms_gib=(predicted.total if device.type == "cuda" else comparable) / GIB,
        measured_memory=measured,
        predicted_memory={t.name: predicted.get(t.name) for t in predicted.terms},
        step_times_s=list(timing.samples),
        **real,
    )
