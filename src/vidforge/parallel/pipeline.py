"""Pipeline parallel training of vidforge's model families (`VideoTransformer`: the DiT and ST-DiT, Wan2.1)
with `torch.distributed.pipelining` (GPipe, 1F1B, interleaved 1F1B).

Split (torchtitan's `pipeline_module_split`): the blocks are divided evenly into pp x vpp stages; stage 0
keeps the family's `input_layers` (the DiT's `patch_embed`, Wan's `patch_embedding`), the last stage its
`output_layers` (the DiT's `final`; Wan's `norm_out`, `proj_out` and top-level `scale_shift_table`), and
every stage keeps the conditioning modules (timestep MLP, text projection, null caption, shared
modulation) and recomputes `model.condition(...)` itself. Stages are placed loop-style: pipeline rank r holds stages r, r + pp, ...
(interleaved 1F1B with vpp > 1 chunks per rank). Parameter names inside a stage module are the whole
model's (`blocks.5.attn...`), so the optimizer, FSDP and DCP checkpoints see the usual names.

Conditioning inputs: torch's schedules pass only the previous stage's outputs between stages, as
positional arguments. The per-sample conditioning inputs (noise level, text embedding, text mask, caption
dropout, and the token `grid` or packed `SequenceLayout`) go to every stage as *keyword* arguments, one
dict per micro-batch (`schedule.step(kwarg_mbs=...)`): the schedule hands each stage the kwargs of the
micro-batch it is running. That is the side channel keyed by micro-batch index, and it is torch's own.
Chosen over threading them through the stages' outputs because (1) every rank of a pipeline already
holds the whole batch (the pp ranks of one data-parallel group read the same samples and draw the same
noise from the same seeded generator), so sending the text embeddings stage to stage would only cost
bandwidth; (2) masks are bool, dropout flags need no gradient, and a packed layout is a host-side Python
object: none of them can travel through the schedule's P2P sends, which carry float activations and
their gradients.

Under context parallel (pp x cp) the stages are cp-sharded like any module (`apply_cp` after the split):
each stage rank's micro-batch is its `TokenShard` of the row, passed as the `shard` kwarg, so the first
stage's input and the activations sent between stages are the local shard's (B, shard.local, hidden), and
packed shards are padded to `pad_to` like packed rows. The runner itself does nothing cp-specific.

Loss on the last stage: the runner knows no objective. The caller hands it each micro-batch's first-stage
input, conditioning kwargs and loss target, and a `loss_fn(index, output, target)` that the last stage
calls for micro-batch `index` (last-stage forwards run in micro-batch order); `scale_grads=False`, so the
caller's loss decides the scaling (vidforge's training step divides each micro-batch's mean by their
count: the step's loss and gradients are the mean of the micro-batch means).

Replicated conditioning parameters get a gradient from each stage that uses them; `step` sums those
over the stages (local chunks, then an all-reduce over the pp group) so every copy holds the whole
model's gradient and the copies stay equal through any optimizer.
"""

from __future__ import annotations

import copy
import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import PipelineScheduleSingle
from torch.distributed.tensor import DTensor

from vidforge.models.backbone import VideoTransformer
from vidforge.profile.parallel import Layout

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}


def stage_local(name: str, model: VideoTransformer) -> bool:
    """Whether parameter `name` belongs to one stage (a block, the input or the output layer); every other
    parameter (conditioning) is on every stage."""
    top = name.split(".", 1)[0]
    return top == "blocks" or top in model.input_layers + model.output_layers


# --- splitting --------------------------------------------------------------------------------------


def stage_indices(pp_rank: int, pp: int, vpp: int = 1) -> list[int]:
    """The stages pipeline rank `pp_rank` holds, loop-style: pp_rank, pp_rank + pp, ... (vpp of them)."""
    if not 0 <= pp_rank < pp:
        raise ValueError(f"pp_rank must be in [0, {pp}), got {pp_rank}")
    return [pp_rank + v * pp for v in range(vpp)]


def stage_blocks(layers: int, num_stages: int) -> list[range]:
    """Block indices of each stage: the blocks divided evenly, in order."""
    if num_stages < 1 or layers % num_stages:  # refused when the profile loads (layout rulebook)
        raise ValueError(f"{num_stages} pipeline stages must divide the {layers} layers")
    per = layers // num_stages
    return [range(s * per, (s + 1) * per) for s in range(num_stages)]


def build_stage(model: VideoTransformer, stage: int, num_stages: int) -> VideoTransformer:
    """A copy of `model` holding only what stage `stage` of `num_stages` runs (see the module docstring).
    The dropped parts are not copied at all (deepcopy's memo maps them to None), so a stage costs only its
    own weights."""
    keep = stage_blocks(len(model.blocks), num_stages)[stage]
    dropped = [block for key, block in model.blocks.items() if int(key) not in keep]
    names = (model.input_layers if stage != 0 else ()) + (
        model.output_layers if stage != num_stages - 1 else ()
    )
    dropped += [getattr(model, name) for name in names]
    part = copy.deepcopy(model, {id(m): None for m in dropped if m is not None})
    for key in [k for k, block in part.blocks._modules.items() if block is None]:
        del part.blocks[key]
    for name in names:
        setattr(part, name, None)
    return part


def split_model(model: VideoTransformer, pp_rank: int, pp: int, vpp: int = 1) -> list[VideoTransformer]:
    """The stage modules of pipeline rank `pp_rank` (vpp of them, in stage order). `model` is left as is."""
    if not isinstance(model, VideoTransformer):
        raise ValueError(f"split_model splits a vidforge model family, got {type(model).__name__}")
    num_stages = pp * vpp
    return [build_stage(model, s, num_stages) for s in stage_indices(pp_rank, pp, vpp)]


def replicated_parameter_names(stage_module: nn.Module) -> list[str]:
    """Names of the parameters every stage holds a copy of (the conditioning modules)."""
    return [n for n, _ in stage_module.named_parameters() if not stage_local(n, stage_module)]


# --- one step's micro-batches --------------------------------------------------------------------------


@dataclass
class PipelineMicroBatches:
    """One step's micro-batches as the schedule takes them: the first stage's input tokens (rows, S, F),
    every stage's conditioning kwargs, and the last stage's loss targets, one each per micro-batch. Packed
    rows (`pad_to`): activations between stages are padded to that many tokens so that every micro-batch
    fits the receivers' buffers; plain batches have one shape."""

    args: list[tuple[torch.Tensor]]
    kwargs: list[dict[str, Any]]
    targets: list[torch.Tensor]
    pad_to: int | None = None

    def key(self) -> tuple:
        """The shapes that fix the P2P buffers: one schedule per key."""
        x, target = self.args[0][0], self.targets[0]
        return (x.shape[0], self.pad_to or x.shape[1], x.shape[-1], target.shape[-1], x.dtype, self.pad_to)


@dataclass
class _StageIO:
    """Shared by the stage hooks: what the activations between stages look like during a step."""

    dtype: torch.dtype
    active: bool = False
    pad_to: int | None = None


def _trim_padded_input(module: VideoTransformer, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook of stages without patch_embed: a packed row (or a context-parallel rank's shard of
    one) arrives padded to the fixed P2P length; the stage runs on its own tokens only (gradients flow
    back through the slice)."""
    layout, shard = kwargs.get("layout"), kwargs.get("shard")
    length = shard.local if shard is not None else layout.total if layout is not None else None
    if not module.has_input_layer and length is not None and args and args[0].shape[1] > length:
        return (args[0][:, :length], *args[1:]), kwargs
    return None


def _fixed_shape_output(io: _StageIO):
    """Forward hook of stages without `final`: the activations they send are in one dtype and (packed
    rows) padded to one length, so that every micro-batch fits the receiver's preallocated buffer."""

    def hook(
        module: VideoTransformer, args: tuple, kwargs: dict, output: torch.Tensor
    ) -> torch.Tensor | None:
        if not io.active or module.has_output_layer:
            return None
        out = output.to(io.dtype)
        if io.pad_to is not None and out.shape[1] < io.pad_to:
            out = F.pad(out, (0, 0, 0, io.pad_to - out.shape[1]))
        return out

    return hook


# --- the runner ------------------------------------------------------------------------------------


class PipelineRunner:
    """Runs the forward and backward of one step's micro-batches through this rank's pipeline stages.

        runner = PipelineRunner(model, dims.mesh["pp"], layout, "1f1b", device)
        # then, per stage module: activation checkpointing / compile / FSDP (apply_fsdp(m, mesh, m.blocks))
        optimizer = AdamW(runner.parameters(), ...)
        losses = runner.step(micro_batches, loss_fn)   # gradients in .grad; losses on the last stage
        norm = runner.clip_grad_norm_(max_norm)
        optimizer.step(); optimizer.zero_grad()

    `activation_dtype` is the dtype of the activations sent between stages: the compute dtype (FSDP's
    param_dtype, or `autocast_dtype`); by default the model's parameter dtype. Whether a layout can run
    (schedule and vpp, micro-batch counts) is the layout rulebook's to say, when the profile loads.
    """

    def __init__(
        self,
        model: VideoTransformer,
        pp_mesh: DeviceMesh,
        layout: Layout,
        schedule: str,
        device: torch.device,
        *,
        autocast_dtype: torch.dtype | None = None,
        activation_dtype: torch.dtype | None = None,
    ) -> None:
        self.pp = pp_mesh.size()
        if self.pp != layout.pp:
            raise ValueError(f"the pp mesh has {self.pp} ranks but the layout has pp={layout.pp}")
        self.vpp = layout.vpp
        self.pp_rank = pp_mesh.get_local_rank()
        self.group = pp_mesh.get_group()
        self.num_stages = self.pp * self.vpp
        self.stage_ids = stage_indices(self.pp_rank, self.pp, self.vpp)
        self.schedule_class = SCHEDULES[schedule]
        self.single_stage = issubclass(self.schedule_class, PipelineScheduleSingle)
        self.microbatches = layout.pp_microbatches
        self.config = model.config
        self.stage_modules: list[VideoTransformer] = split_model(model, self.pp_rank, self.pp, self.vpp)
        self.replicated = replicated_parameter_names(self.stage_modules[0])
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.io = _StageIO(activation_dtype or autocast_dtype or model.param_dtype)
        for module in self.stage_modules:
            module.register_forward_pre_hook(_trim_padded_input, with_kwargs=True)
            module.register_forward_hook(_fixed_shape_output(self.io), with_kwargs=True)
        # torch >= 2.12 takes micro-batches already split (needed for packed rows, whose conditioning
        # differs in size per row); older schedules split one whole batch along dim 0 themselves.
        self.presplit = "arg_mbs" in inspect.signature(self.schedule_class.step).parameters
        self._schedules: OrderedDict[tuple, Any] = OrderedDict()
        self._loss_fn: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self._loss_calls = 0

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter of this rank's stage modules (replicated ones once per local stage)."""
        for module in self.stage_modules:
            yield from module.parameters()

    def train(self, mode: bool = True) -> None:
        for module in self.stage_modules:
            module.train(mode)

    # --- schedules ----------------------------------------------------------------------------------

    def _schedule_for(self, mbs: PipelineMicroBatches):
        """The schedule for this step's shapes. Stages are built with static shapes (no inference run),
        and receive buffers are sized from them, so each distinct shape gets its own schedule; the few
        most recent are kept."""
        key = mbs.key()
        schedule = self._schedules.get(key)
        if schedule is not None:
            self._schedules.move_to_end(key)
            return schedule

        def meta(shape: tuple[int, ...], dtype: torch.dtype, grad: bool = True) -> torch.Tensor:
            # requires_grad marks which received activations get a gradient sent back
            return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)

        rows, seq, features, out_features, input_dtype, _ = key
        hidden = meta((rows, seq, self.config.hidden), self.io.dtype)
        stages = []
        for index, module in zip(self.stage_ids, self.stage_modules, strict=True):
            first, last = index == 0, index == self.num_stages - 1
            stages.append(
                PipelineStage(
                    module,
                    index,
                    self.num_stages,
                    self.device,
                    input_args=meta((rows, seq, features), input_dtype, grad=False) if first else hidden,
                    output_args=meta((rows, seq, out_features), self.io.dtype) if last else hidden,
                    group=self.group,
                )
            )
        schedule = self.schedule_class(
            stages[0] if self.single_stage else stages,
            n_microbatches=self.microbatches,
            loss_fn=self._loss,
            scale_grads=False,
        )
        self._schedules[key] = schedule
        while len(self._schedules) > 4:
            self._schedules.popitem(last=False)
        return schedule

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Last stage: the caller's loss of the micro-batch. Last-stage forwards run in micro-batch
        order, so the call count is the index."""
        index = self._loss_calls
        self._loss_calls += 1
        assert self._loss_fn is not None  # set by step() for its duration
        return self._loss_fn(index, output, target)

    # --- the step -------------------------------------------------------------------------------------

    def step(
        self,
        mbs: PipelineMicroBatches,
        loss_fn: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> list[torch.Tensor]:
        """Forward and backward of one step's micro-batches through the pipeline; gradients land in the
        stage modules' `.grad` (added to what is there, like `loss.backward()`), replicated parameters'
        summed over the stages. Returns the micro-batches' losses on the last stage (empty elsewhere)."""
        if len(mbs.args) != self.microbatches:
            raise ValueError(f"a pipeline step takes {self.microbatches} micro-batches, got {len(mbs.args)}")
        if mbs.pad_to is not None and not self.presplit:
            raise RuntimeError(
                "pipeline parallel over packed rows needs torch's pre-split micro-batches "
                "(schedule.step(arg_mbs=...), torch >= 2.12); set data.packing=false for bucket batches"
            )
        schedule = self._schedule_for(mbs)
        before = self._replicated_grads()
        losses: list[torch.Tensor] = []
        self._loss_fn, self._loss_calls = loss_fn, 0
        self.io.active, self.io.pad_to = True, mbs.pad_to
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype
            else nullcontext()
        )
        try:
            with autocast:
                if self.presplit:
                    schedule.step(
                        arg_mbs=mbs.args,
                        kwarg_mbs=mbs.kwargs,
                        target_mbs=mbs.targets,
                        losses=losses,
                        return_outputs=False,
                    )
                else:
                    self._whole_batch_step(schedule, mbs, losses)
        finally:
            self.io.active, self.io.pad_to, self._loss_fn = False, None, None
        self._sum_replicated_grads(before)
        return losses

    @staticmethod
    def _whole_batch_step(schedule: Any, mbs: PipelineMicroBatches, losses: list) -> None:
        """torch < 2.12: hand the schedule the whole batch and let it split every tensor along dim 0
        (an even split, as the caller made); the token grid (or context-parallel TokenShard, which is
        per row) is replicated to each micro-batch."""
        kwargs = {
            name: torch.cat([kw[name] for kw in mbs.kwargs]) if torch.is_tensor(value) else value
            for name, value in mbs.kwargs[0].items()
        }
        x = torch.cat([a[0] for a in mbs.args])
        target = torch.cat(mbs.targets)
        schedule.step(x, target=target, losses=losses, **kwargs)

    # --- replicated (conditioning) parameters ---------------------------------------------------------

    @staticmethod
    def _local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    def _replicas(self) -> list[list[nn.Parameter]]:
        """For each replicated name, its copy in each local stage module (looked up each time: FSDP
        replaces parameters by sharded ones)."""
        params = [dict(module.named_parameters()) for module in self.stage_modules]
        return [[p[name] for p in params] for name in self.replicated]

    def _replicated_grads(self) -> list[torch.Tensor | None]:
        """The replicated parameters' gradients before a step (all copies equal), to sum only the step's
        own contributions afterwards: the sum stays right under gradient accumulation."""
        return [
            None if copies[0].grad is None else self._local(copies[0].grad).detach().clone()
            for copies in self._replicas()
        ]

    @torch.no_grad()
    def _sum_replicated_grads(self, before: list[torch.Tensor | None]) -> None:
        """Each stage's copy of a conditioning parameter holds only its own stage's gradient; the whole
        model's gradient is their sum. Sum the step's contributions over the local chunks and the pp group
        (one flat all-reduce) and give every copy the total."""
        replicas = self._replicas()
        deltas = []
        for copies, old in zip(replicas, before, strict=True):
            local = torch.zeros_like(self._local(copies[0].detach()))
            for p in copies:
                if p.grad is not None:
                    local += self._local(p.grad)
                    if old is not None:
                        local -= old
            deltas.append(local)
        if not deltas:
            return
        flat = torch.cat([d.reshape(-1) for d in deltas])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for copies, old, d in zip(replicas, before, deltas, strict=True):
            total = flat[offset : offset + d.numel()].view_as(d)
            offset += d.numel()
            if old is not None:
                total = total + old
            for p in copies:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._local(p.grad).copy_(total)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The whole model's L2 gradient norm (each replicated parameter counted once: on stage 0), over
        the pp group and, for DTensor gradients (FSDP shards, tensor-parallel blocks, replicated
        conditioning: several meshes), over their meshes; then torch's clipping of every local gradient.
        Returns the norm as a float64 plain tensor."""
        from vidforge.parallel.tensor_parallel import grad_norm, reduce_partial_grads

        reduce_partial_grads(self.parameters())
        counted = []
        for index, module in zip(self.stage_ids, self.stage_modules, strict=True):
            for name, p in module.named_parameters():
                if p.grad is not None and (index == 0 or stage_local(name, module)):
                    counted.append(p.grad)
        square = grad_norm(counted) ** 2
        dist.all_reduce(square, group=self.group)
        norm = square.sqrt()
        coef = max_norm / (float(norm) + 1e-6)  # torch's formula; scalar, as the meshes differ
        if coef < 1.0:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm
