"""One training step, the same for `vidforge train` and `vidforge bench train`: the batches a step
consumes, forward and backward of the loss (`DenoisingLoss`), gradient clipping, the numbers the loop
logs, and the update. Two implementations: `LocalTrainStep` (one module: train.grad_accum micro-batches,
any layout but pipeline) and `PipelineTrainStep` (this rank's pipeline stages: parallel.pp_microbatches
micro-batches through the schedule, which are its gradient accumulation).

    step = make_train_step(profile, runtime, parts)  # train.make_step
    batches = step.next_batches(batcher)        # None when the data ran out
    result = step(batches)                      # forward, backward, clip; loss and norm over all ranks
    step.apply() if result.finite else step.zero_grad()

Each part runs in a profiler range named `step.<part>` (draw, model, loss, backward, clip, optimizer, ema,
zero_grad): a profile of a step, on any device, says where its time goes (bench/step_vs_peer.py reads them).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch.profiler import record_function

from vidforge.data.batching import BucketBatch, PackedBatch
from vidforge.diffusion import build_objective
from vidforge.memory_savers.activation_checkpoint import recompute_fraction
from vidforge.models import forward_flops
from vidforge.models.flops import FlopCount
from vidforge.parallel.runtime import Runtime
from vidforge.profile import RunProfile
from vidforge.train.build import TrainParts
from vidforge.train.experts import expert_objective
from vidforge.train.loss import DenoisingLoss, MicroInputs, MicroLoss
from vidforge.train.metrics import LossByLevel

Batch = PackedBatch | BucketBatch

PAD_GRANULE = 64
"""Pipeline x context parallel over packed rows: the activations between stages are padded to a multiple
of this many tokens (see `PipelineTrainStep._pad_to`)."""


class BatchSource(Protocol):
    def next_batch(self) -> Batch | None: ...


@dataclass
class StepLosses:
    """What one rank's forward and backward of a step give: its loss (its share under context parallel),
    tokens and model FLOPs, and every sample's noise level and loss (for the loss per noise level)."""

    loss: float
    tokens: float
    flops: float  # model FLOPs
    hardware_flops: float  # with the recomputed forwards
    level: torch.Tensor
    per_sample: torch.Tensor
    extra: dict[str, float] = field(default_factory=dict)  # more metrics, averaged over ranks like the loss


@dataclass
class StepResult:
    """One step over every rank: the mean loss, the whole model's gradient norm (before clipping), and
    the tokens, model FLOPs (MFU's) and hardware FLOPs (HFU's: with activation recompute) processed,
    each counted once, not per model-parallel rank."""

    loss: float
    grad_norm: float
    tokens: float
    flops: float
    hardware_flops: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


class TrainStep(ABC):
    """The parts of one step that do not depend on how the model is split (see the module docstring)."""

    def __init__(self, profile: RunProfile, runtime: Runtime, parts: TrainParts) -> None:
        self.profile = profile
        self.runtime = runtime
        self.parts = parts
        self.device = runtime.device
        # a two-expert model's run: the times its expert runs at (`vidforge.train.experts`)
        objective = expert_objective(build_objective(profile.diffusion), profile)
        model = parts.modules[0].config  # the model being trained (a pipeline stage carries the whole config)
        dropout = profile.diffusion.caption_dropout
        self.loss = DenoisingLoss(
            objective,
            dropout,
            tuple(model.patch),
            model.in_channels,
            model.text_dim,
            image_condition=profile.diffusion.image_condition,
            # the data's first-frame latents; a model that samples from text reads zeros there itself
            condition_channels=model.condition_channels if model.samples_from_image else 0,
        )
        # the logging window's loss per noise level (the loop resets it)
        self.by_level = LossByLevel(objective)
        train = profile.train
        # of the whole model's blocks: FLOPs are counted for the whole model per data-parallel group
        self.recompute = recompute_fraction(
            model.layers, train.activation_checkpointing, train.checkpoint_ratio
        )
        # Context parallel: this rank draws its TokenShard of every row and holds only those tokens, in a
        # pipeline stage as in one module.
        dims = runtime.dims
        self.cp = dims.layout.cp
        self.cp_group = dims.mesh["cp"].get_group() if dims.cp_enabled else None
        self.shard_of = None
        if self.cp_group is not None:
            from vidforge.parallel.context_parallel import shard_of

            group, slicing = self.cp_group, profile.parallel.token_slicing
            self.shard_of = lambda row: shard_of(row, group, slicing)

    @abstractmethod
    def next_batches(self, source: BatchSource) -> list[Batch] | None:
        """The batches one step consumes, or None when the data ran out."""

    @abstractmethod
    def forward_backward(self, batches: list[Batch]) -> StepLosses:
        """Gradients of the step's loss into .grad (added to what is there)."""

    @abstractmethod
    def clip_grad_norm_(self, max_norm: float) -> float:
        """The whole model's gradient norm, then clipping to `max_norm`."""

    def __call__(self, batches: list[Batch]) -> StepResult:
        done = self.forward_backward(batches)
        self.by_level.add(done.level, done.per_sample)
        with record_function("step.clip"):
            grad_norm = self.clip_grad_norm_(self.profile.train.grad_clip or math.inf)
        names = sorted(done.extra)
        loss, tokens, flops, hardware, *extra = _all_reduce_sum(
            [done.loss, done.tokens, done.flops, done.hardware_flops, *(done.extra[k] for k in names)],
            self.device,
        )
        # Summed over every rank: the cp shares add up to each micro-batch's loss, tp ranks hold copies
        # of it, and so do pp ranks (the last stage's loss is sent to the whole pipeline); tokens and
        # FLOPs are counted once per model-parallel group member.
        layout, dims = self.runtime.dims.layout, self.runtime.dims
        copies = layout.dp * layout.tp * layout.pp
        return StepResult(
            loss / copies,
            grad_norm,
            tokens / dims.model_parallel,
            flops / dims.model_parallel,
            hardware / dims.model_parallel,
            {name: value / copies for name, value in zip(names, extra, strict=True)},
        )

    def set_lr(self, lr: float) -> None:
        for optimizer in self.parts.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr

    def apply(self, zero_grad: bool = True) -> None:
        """The optimizer step and the EMA update; then the gradients cleared (unless told not to, to
        measure them)."""
        with record_function("step.optimizer"):
            for optimizer in self.parts.optimizers:
                optimizer.step()
        if self.parts.ema is not None:
            with record_function("step.ema"):
                self.parts.ema.update(self.parts.modules)
        if zero_grad:
            self.zero_grad()

    def zero_grad(self) -> None:
        with record_function("step.zero_grad"):
            for optimizer in self.parts.optimizers:
                optimizer.zero_grad(set_to_none=True)

    def flops(self, batch: Batch) -> tuple[float, float]:
        """Model and hardware FLOPs of one batch's forward and backward (hardware: with the forward of
        the activation-checkpointed blocks run again). MFU counts the model's only."""
        count = self.flop_count(batch)
        return float(count.train_step()), float(count.train_step(self.recompute))

    def flop_count(self, batch: Batch) -> FlopCount:
        """The model's forward FLOPs on one batch, by part."""
        text_lens = batch.text_mask.sum(dim=1).tolist()
        if isinstance(batch, PackedBatch):
            grids = batch.layout.grids
        else:
            pt, ph, pw = self.profile.model.patch
            b, _, t, h, w = batch.latents.shape
            grids = [(t // pt, h // ph, w // pw)] * b
        image_lens = batch.image_emb.shape[1] if batch.image_emb is not None else 0
        # first-frame conditioning draws a noise level per token for every batch (`DenoisingLoss.draw`)
        token_levels = bool(self.loss.image_condition)
        return forward_flops(self.profile.model, grids, text_lens, image_lens, token_levels)


class LocalTrainStep(TrainStep):
    """One module on this rank (data, tensor and context parallel, or none): train.grad_accum
    micro-batches, each backpropagated as it comes."""

    def __init__(self, profile: RunProfile, runtime: Runtime, parts: TrainParts) -> None:
        super().__init__(profile, runtime, parts)
        self.model = parts.modules[0]

    def next_batches(self, source: BatchSource) -> list[Batch] | None:
        batches = []
        for _ in range(self.profile.train.grad_accum):
            batch = source.next_batch()
            if batch is None:
                return None
            batches.append(batch)
        return batches

    def forward(self, batch: Batch) -> MicroLoss:
        with record_function("step.draw"):
            inputs = self.loss.draw(batch, self.device, self.shard_of)
        dtype = self.parts.compute_dtype
        with (
            record_function("step.model"),
            torch.autocast(self.device.type, dtype=dtype) if dtype else nullcontext(),
        ):
            output = self.model(inputs.x, **inputs.model_kwargs)
        with record_function("step.loss"):
            return self.loss.reduce(output, inputs, self.cp_group)

    def backward(self, micro: MicroLoss) -> None:
        # Under context parallel each rank's loss is its share of the mean and FSDP averages the
        # gradients over dp_shard x cp: scale by cp so the cp shares add up instead.
        with record_function("step.backward"):
            (micro.loss * self.cp / self.profile.train.grad_accum).backward()

    def forward_backward(self, batches: list[Batch]) -> StepLosses:
        loss = tokens = 0.0
        levels, per_sample = [], []
        for batch in batches:
            micro = self.forward(batch)
            self.backward(micro)
            loss += micro.loss.item() / len(batches)
            tokens += micro.tokens
            levels.append(micro.level)
            per_sample.append(micro.per_sample)
        flops, hardware = map(sum, zip(*map(self.flops, batches), strict=True))
        return StepLosses(loss, tokens, flops, hardware, torch.cat(levels), torch.cat(per_sample))

    def clip_grad_norm_(self, max_norm: float) -> float:
        return clip_module(self.model, max_norm, self.runtime.dims.tp_enabled)


def clip_module(module: torch.nn.Module, max_norm: float, tp_enabled: bool) -> float:
    """One module's whole gradient norm (over its shards), then clipping to `max_norm`."""
    params = module.parameters()
    if tp_enabled:  # parameters on several meshes; partial gradients reduced first
        from vidforge.parallel.tensor_parallel import clip_grad_norm_

        norm = clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


class PipelineTrainStep(TrainStep):
    """This rank's pipeline stages (`parts.pipeline`): one step is parallel.pp_microbatches micro-batches
    through the schedule: that many packed rows, or one bucket batch split evenly. Every pp rank draws
    the whole step's noise (the same values: same seed, same order as `LocalTrainStep`), the first stage
    uses the inputs, the last the targets; the loss and per-sample losses go from the last stage to every
    pp rank.

    Under context parallel every stage holds its cp rank's `TokenShard` of each micro-batch: the first
    stage takes the shard's tokens, the stream between stages is the shard's hidden states (the P2P
    buffers are the local shard's shape), and the last stage takes its share of the loss as
    `LocalTrainStep` does (backpropagated x cp: FSDP over dp_shard x cp averages)."""

    def __init__(self, profile: RunProfile, runtime: Runtime, parts: TrainParts) -> None:
        super().__init__(profile, runtime, parts)
        assert parts.pipeline is not None
        self.runner = parts.pipeline
        self.microbatches = runtime.dims.layout.pp_microbatches

    def next_batches(self, source: BatchSource) -> list[Batch] | None:
        first = source.next_batch()
        if first is None:
            return None
        if isinstance(first, BucketBatch):
            # one batch, split by the step; a last batch too small to split evenly ends the data
            return None if first.latents.shape[0] % self.microbatches else [first]
        rows = [first]
        for _ in range(self.microbatches - 1):
            row = source.next_batch()
            if row is None:
                return None
            rows.append(row)
        return rows

    def _micro_inputs(self, batches: list[Batch]) -> list[MicroInputs]:
        if isinstance(batches[0], PackedBatch):
            return [self.loss.draw(row, self.device, self.shard_of) for row in batches]
        whole = self.loss.draw(batches[0], self.device, self.shard_of)
        m = self.microbatches
        kwargs = whole.model_kwargs
        # per-sample tensors split with the rows; the grid or the (per-row) TokenShard goes to every one
        split = {name: value.tensor_split(m) for name, value in kwargs.items() if torch.is_tensor(value)}
        shared = {name: value for name, value in kwargs.items() if name not in split}
        scales = [None] * m if whole.error_scale is None else whole.error_scale.tensor_split(m)
        return [
            MicroInputs(
                x=x,
                target=target,
                model_kwargs={**{name: parts[i] for name, parts in split.items()}, **shared},
                level=level,
                tokens=whole.tokens // m,
                shard=whole.shard,
                error_scale=scale,
            )
            for i, (x, target, level, scale) in enumerate(
                zip(
                    whole.x.tensor_split(m),
                    whole.target.tensor_split(m),
                    whole.level.tensor_split(m),
                    scales,
                    strict=True,
                )
            )
        ]

    def _pad_to(self, batches: list[Batch], inputs: list[MicroInputs]) -> int | None:
        """Packed rows: the token count every micro-batch's activations are padded to between stages, so
        that one schedule's receive buffers fit them all: the row budget, or under context parallel the
        step's largest shard (sum of ceil(n_i / cp) over its samples: it varies with the samples a row
        holds) rounded up to PAD_GRANULE tokens, so that few distinct shapes (schedules) arise."""
        if not isinstance(batches[0], PackedBatch):
            return None
        if self.shard_of is None:
            return max(row.budget for row in batches)
        local = max(mi.shard.local for mi in inputs if mi.shard is not None)
        return -(-local // PAD_GRANULE) * PAD_GRANULE

    def forward_backward(self, batches: list[Batch]) -> StepLosses:
        from vidforge.parallel.pipeline import PipelineMicroBatches

        inputs = self._micro_inputs(batches)
        mbs = PipelineMicroBatches(
            args=[(mi.x,) for mi in inputs],
            kwargs=[mi.model_kwargs for mi in inputs],
            targets=[mi.target for mi in inputs],
            pad_to=self._pad_to(batches, inputs),
        )
        shares: list[torch.Tensor] = []
        per_sample: list[torch.Tensor] = []

        def loss_fn(index: int, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            # the per-sample losses are summed over the cp group here: every cp rank of the last stage
            # runs its micro-batches' losses in the same order
            micro = self.loss.reduce(output, inputs[index], self.cp_group)
            share = micro.loss / len(inputs)
            shares.append(share.detach())
            per_sample.append(micro.per_sample)
            return share * self.cp

        self.runner.step(mbs, loss_fn)
        level = torch.cat([mi.level for mi in inputs])
        values = torch.zeros(1 + level.shape[0], dtype=torch.float64, device=self.device)
        if self.runner.has_last_stage:
            values[0] = torch.stack(shares).sum()
            values[1:] = torch.cat(per_sample)
        dist.all_reduce(values, group=self.runner.group)
        tokens = float(sum(mi.tokens for mi in inputs))
        flops, hardware = map(sum, zip(*map(self.flops, batches), strict=True))
        return StepLosses(float(values[0]), tokens, flops, hardware, level, values[1:])

    def clip_grad_norm_(self, max_norm: float) -> float:
        # the whole model's norm over the pp group, replicated parameters once
        return float(self.runner.clip_grad_norm_(max_norm))


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
