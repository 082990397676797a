"""Pipeline parallel training of the DiT with `torch.distributed.pipelining` (GPipe, 1F1B, interleaved 1F1B).

Split (torchtitan's `pipeline_module_split`, for the DiT): the blocks are divided evenly into pp x vpp
stages; stage 0 keeps `patch_embed`, the last stage keeps `final`, and every stage keeps the conditioning
modules (timestep MLP, text projection, null caption, shared adaLN modulation) and recomputes
`DiT.condition(...)` itself. Stages are placed loop-style: pipeline rank r holds stages r, r + pp, ...
(interleaved 1F1B with vpp > 1 chunks per rank). Parameter names inside a stage module are the whole
model's (`blocks.5.attn...`), so the optimizer, FSDP and DCP checkpoints see the usual names.

Conditioning inputs: torch's schedules pass only the previous stage's outputs between stages, as
positional arguments. The per-sample conditioning inputs (c_noise, text embedding, text mask, caption
dropout, and the token `grid` or packed `SequenceLayout`) go to every stage as *keyword* arguments, one
dict per micro-batch (`schedule.step(kwarg_mbs=...)`): the schedule hands each stage the kwargs of the
micro-batch it is running. That is the side channel keyed by micro-batch index, and it is torch's own.
Chosen over threading them through the stages' outputs because (1) every rank of a pipeline already
holds the whole batch (the pp ranks of one data-parallel group read the same samples and draw the same
noise from the same seeded generator), so sending the text embeddings stage to stage would only cost
bandwidth; (2) masks are bool, dropout flags need no gradient, and a packed layout is a host-side Python
object: none of them can travel through the schedule's P2P sends, which carry float activations and
their gradients.

Loss on the last stage. EDM's denoiser is D = c_skip x + c_out F with weight lambda = 1 / c_out^2
(`EDM.loss_weight`: (sigma^2 + sd^2) / (sigma sd)^2, and lambda c_out^2 = 1), so

    lambda (D - y)^2 = (F - (y - c_skip x) / c_out)^2 ,

a plain squared error on the raw network output F against a target built where the clean latents y and
the noisy x are (every pp rank has them; only the last stage uses it). So the last stage needs no
preconditioning, and the loss equals `train.step.micro_batch_loss`'s per element (to rounding: the
coefficients are computed in the latents' dtype, and the squared error in float32 or wider). Each micro-batch's
loss is its mean divided by the number of micro-batches (`scale_grads=False`), so a step's loss and
gradients are the mean of the micro-batch means: for a bucket batch split evenly, the whole batch's
mean; for packed rows (one row per micro-batch), what gradient accumulation over the rows gives.

Replicated conditioning parameters get a gradient from each stage that uses them; `step` sums those
over the stages (local chunks, then an all-reduce over the pp group) so every copy holds the whole
model's gradient and the copies stay equal through any optimizer.
"""

from __future__ import annotations

import copy
import inspect
from collections import OrderedDict
from collections.abc import Iterator, Sequence
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

from vidforge.data.packing import BucketBatch, PackedBatch
from vidforge.diffusion import EDM
from vidforge.errors import UserInputError
from vidforge.models.dit import DiT
from vidforge.models.packing import SequenceLayout
from vidforge.models.patchify import patchify, token_grid
from vidforge.profile import RunProfile
from vidforge.train.step import MicroLoss

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}
STAGE_LOCAL_PREFIXES = ("patch_embed.", "final.", "blocks.")
"""Parameters under these belong to one stage; every other parameter (conditioning) is on every stage."""


# --- splitting --------------------------------------------------------------------------------------


def stage_indices(pp_rank: int, pp: int, vpp: int = 1) -> list[int]:
    """The stages pipeline rank `pp_rank` holds, loop-style: pp_rank, pp_rank + pp, ... (vpp of them)."""
    if not 0 <= pp_rank < pp:
        raise ValueError(f"pp_rank must be in [0, {pp}), got {pp_rank}")
    return [pp_rank + v * pp for v in range(vpp)]


def stage_blocks(layers: int, num_stages: int) -> list[range]:
    """Block indices of each stage: the blocks divided evenly, in order."""
    if num_stages < 1 or layers % num_stages:
        raise UserInputError(
            f"parallel.pp x parallel.vpp = {num_stages} stages must divide model.layers={layers}; "
            "change pp/vpp or the layer count"
        )
    per = layers // num_stages
    return [range(s * per, (s + 1) * per) for s in range(num_stages)]


def build_stage(model: DiT, stage: int, num_stages: int) -> DiT:
    """A copy of `model` holding only what stage `stage` of `num_stages` runs (see the module docstring).
    The dropped parts are not copied at all (deepcopy's memo maps them to None), so a stage costs only its
    own weights."""
    keep = stage_blocks(len(model.blocks), num_stages)[stage]
    dropped = [block for key, block in model.blocks.items() if int(key) not in keep]
    if stage != 0:
        dropped.append(model.patch_embed)
    if stage != num_stages - 1:
        dropped.append(model.final)
    part = copy.deepcopy(model, {id(m): None for m in dropped if m is not None})
    for key in [k for k, block in part.blocks._modules.items() if block is None]:
        del part.blocks[key]
    if stage != 0:
        part.patch_embed = None
    if stage != num_stages - 1:
        part.final = None
    return part


def split_model(model: DiT, pp_rank: int, pp: int, vpp: int = 1) -> list[DiT]:
    """The stage modules of pipeline rank `pp_rank` (vpp of them, in stage order). `model` is left as is."""
    if not isinstance(model, DiT):
        raise ValueError(f"split_model splits a vidforge DiT, got {type(model).__name__}")
    num_stages = pp * vpp
    return [build_stage(model, s, num_stages) for s in stage_indices(pp_rank, pp, vpp)]


def replicated_parameter_names(stage_module: nn.Module) -> list[str]:
    """Names of the parameters every stage holds a copy of (the conditioning modules)."""
    return [n for n, _ in stage_module.named_parameters() if not n.startswith(STAGE_LOCAL_PREFIXES)]


def edm_raw_target(edm: EDM, clean: torch.Tensor, noisy: torch.Tensor, sigma_b: torch.Tensor) -> torch.Tensor:
    """(y - c_skip x) / c_out: the raw network output F that makes D(x) = y. The EDM-weighted loss
    lambda (D - y)^2 equals (F - target)^2 because lambda c_out^2 = 1."""
    return (clean - edm.c_skip(sigma_b) * noisy) / edm.c_out(sigma_b)


# --- one step's micro-batches --------------------------------------------------------------------------


@dataclass
class _MicroBatches:
    """What the schedule takes for one step, plus what the loss and the metrics need afterwards."""

    args: list[tuple[torch.Tensor]]  # first stage's input c_in * x, per micro-batch
    kwargs: list[dict[str, Any]]  # conditioning inputs, per micro-batch, for every stage
    targets: list[torch.Tensor]  # raw-output targets in token layout, per micro-batch (last stage)
    layouts: list[SequenceLayout | None]
    sigma: torch.Tensor  # (N,) every sample of the step, micro-batch order
    tokens: int
    key: tuple  # shapes that fix the P2P buffers: one schedule per key
    input_shape: tuple[int, ...]  # first stage's input, one micro-batch
    hidden_shape: tuple[int, ...]  # activations between stages, one micro-batch
    output_shape: tuple[int, ...]  # last stage's output, one micro-batch
    input_dtype: torch.dtype
    pad_to: int | None = None  # packed rows: activations padded to this many tokens between stages


@dataclass
class _StageIO:
    """Shared by the stage hooks: what the activations between stages look like during a step."""

    dtype: torch.dtype
    active: bool = False
    pad_to: int | None = None


def _trim_padded_input(module: DiT, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook of stages without patch_embed: a packed row arrives padded to the fixed P2P
    length; the stage runs on its real tokens only (gradients flow back through the slice)."""
    layout = kwargs.get("layout")
    if module.patch_embed is None and layout is not None and args and args[0].shape[1] > layout.total:
        return (args[0][:, : layout.total], *args[1:]), kwargs
    return None


def _fixed_shape_output(io: _StageIO):
    """Forward hook of stages without `final`: the activations they send are in one dtype and (packed
    rows) padded to one length, so that every micro-batch fits the receiver's preallocated buffer."""

    def hook(module: DiT, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor | None:
        if not io.active or module.final is not None:
            return None
        out = output.to(io.dtype)
        if io.pad_to is not None and out.shape[1] < io.pad_to:
            out = F.pad(out, (0, 0, 0, io.pad_to - out.shape[1]))
        return out

    return hook


# --- the runner ------------------------------------------------------------------------------------


class PipelineTrainer:
    """Runs one training step of the pipeline on this rank's stages.

        trainer = PipelineTrainer(model, dims.mesh["pp"], profile, device)
        # then, per stage module: activation checkpointing / compile / FSDP (apply_fsdp(m, mesh, m.blocks))
        optimizer = AdamW(trainer.parameters(), ...)
        micro = trainer.step(batch)      # forward + backward of every micro-batch; gradients in .grad
        norm = trainer.clip_grad_norm_(max_norm)
        optimizer.step(); optimizer.zero_grad()

    `batch` is one BucketBatch (split evenly into the micro-batches: its size must be a multiple of
    pp_microbatches) or a sequence of pp_microbatches PackedBatch rows (one row per micro-batch).
    `step` returns a `MicroLoss` on every pp rank (loss and per-sample losses sent from the last stage).
    Noise levels, caption dropout and noise are drawn from torch's global CPU generator in the same order
    as `train.step.micro_batch_loss`, so all pp ranks (seeded alike) draw the same values.

    `activation_dtype` is the dtype of the activations sent between stages: the compute dtype (FSDP's
    param_dtype, or `autocast_dtype`); by default the model's parameter dtype.
    """

    def __init__(
        self,
        model: DiT,
        pp_mesh: DeviceMesh,
        profile: RunProfile,
        device: torch.device,
        *,
        autocast_dtype: torch.dtype | None = None,
        activation_dtype: torch.dtype | None = None,
    ) -> None:
        parallel = profile.parallel
        self.pp = pp_mesh.size()
        if self.pp != parallel.pp:
            raise ValueError(f"the pp mesh has {self.pp} ranks but parallel.pp={parallel.pp}")
        self.vpp = parallel.vpp
        self.pp_rank = pp_mesh.get_local_rank()
        self.group = pp_mesh.get_group()
        self.num_stages = self.pp * self.vpp
        self.stage_ids = stage_indices(self.pp_rank, self.pp, self.vpp)
        self.schedule_class = SCHEDULES[parallel.pp_schedule]
        self.single_stage = issubclass(self.schedule_class, PipelineScheduleSingle)
        if self.single_stage != (self.vpp == 1):
            raise UserInputError(
                f"parallel.pp_schedule={parallel.pp_schedule} with vpp={self.vpp}: use interleaved-1f1b "
                "for vpp > 1 and gpipe or 1f1b for vpp = 1"
            )
        self.microbatches = parallel.pp_microbatches or self.num_stages
        if parallel.pp_schedule == "1f1b" and self.microbatches < self.pp:
            raise UserInputError(
                f"parallel.pp_microbatches={self.microbatches}: 1F1B needs at least pp={self.pp} "
                "micro-batches; raise it (0 picks pp x vpp)"
            )
        self.config = model.config
        self.stage_modules: list[DiT] = split_model(model, self.pp_rank, self.pp, self.vpp)
        self.replicated = replicated_parameter_names(self.stage_modules[0])
        self.edm = EDM.from_profile(profile.diffusion)
        self.caption_dropout = profile.diffusion.caption_dropout
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
        self._current: _MicroBatches | None = None
        self._loss_calls = 0
        self._per_sample: list[torch.Tensor] = []

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

    # --- micro-batches ------------------------------------------------------------------------------

    def _check_channels(self, channels: int) -> None:
        if channels != self.config.in_channels:
            raise UserInputError(
                f"model.in_channels: the latents have {channels} channels, the model takes "
                f"{self.config.in_channels}; set --set model.in_channels={channels}"
            )

    def _draw(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise levels and caption dropout, drawn as `micro_batch_loss` draws them."""
        sigma = self.edm.sample_sigma(n).to(self.device)
        drop_text = (torch.rand(n) < self.caption_dropout).to(self.device)
        return sigma, drop_text

    def _bucket_micro_batches(self, batch: BucketBatch) -> _MicroBatches:
        m, cfg, edm = self.microbatches, self.config, self.edm
        clean = batch.latents.to(self.device)
        b = clean.shape[0]
        if b % m:
            raise UserInputError(
                f"parallel.pp_microbatches={m} must divide the batch of {b} samples (data.batch_size): "
                "the pipeline splits each batch evenly"
            )
        self._check_channels(clean.shape[1])
        text, text_mask = batch.text_emb.to(self.device), batch.text_mask.to(self.device)
        sigma, drop_text = self._draw(b)
        noise = torch.randn(clean.shape, dtype=clean.dtype).to(self.device)
        sigma_b = edm.expand(sigma, clean).to(clean.dtype)  # coefficients in the latents' precision
        noisy = clean + sigma_b * noise
        x_in = edm.c_in(sigma_b) * noisy
        target = patchify(edm_raw_target(edm, clean, noisy, sigma_b), cfg.patch)
        grid = token_grid(clean.shape[2:], cfg.patch)
        c_noise = edm.c_noise(sigma)
        pieces = [t.tensor_split(m) for t in (x_in, target, c_noise, text, text_mask, drop_text)]
        kwargs = [
            {"noise_level": c, "text": t, "text_mask": k, "drop_text": d, "grid": grid}
            for c, t, k, d in zip(*pieces[2:], strict=True)
        ]
        mb = b // m
        seq = grid[0] * grid[1] * grid[2]
        return _MicroBatches(
            args=[(x,) for x in pieces[0]],
            kwargs=kwargs,
            targets=list(pieces[1]),
            layouts=[None] * m,
            sigma=sigma,
            tokens=b * seq,
            key=("bucket", tuple(x_in.shape[1:]), mb, x_in.dtype),
            input_shape=(mb, *x_in.shape[1:]),
            hidden_shape=(mb, seq, cfg.hidden),
            output_shape=(mb, seq, target.shape[-1]),
            input_dtype=x_in.dtype,
        )

    def _packed_micro_batches(self, rows: Sequence[PackedBatch]) -> _MicroBatches:
        m, cfg, edm = self.microbatches, self.config, self.edm
        if len(rows) != m:
            raise UserInputError(
                f"parallel.pp_microbatches={m}: a pipeline step takes {m} packed rows, got {len(rows)}"
            )
        budget = max(row.budget for row in rows)
        args, kwargs, targets, layouts, sigmas = [], [], [], [], []
        for row in rows:
            layout = row.layout
            text, text_mask = row.text_emb.to(self.device), row.text_mask.to(self.device)
            sigma, drop_text = self._draw(text.shape[0])
            clean = row.tokens.to(self.device)
            self._check_channels(clean.shape[-1] // (cfg.patch[0] * cfg.patch[1] * cfg.patch[2]))
            noise = torch.randn(clean.shape, dtype=clean.dtype).to(self.device)
            sigma_b = layout.per_token(sigma)[..., None].to(clean.dtype)
            noisy = clean + sigma_b * noise
            args.append((edm.c_in(sigma_b) * noisy,))
            targets.append(edm_raw_target(edm, clean, noisy, sigma_b))
            kwargs.append(
                {
                    "noise_level": edm.c_noise(sigma),
                    "text": text,
                    "text_mask": text_mask,
                    "drop_text": drop_text,
                    "layout": layout,
                }
            )
            layouts.append(layout)
            sigmas.append(sigma)
        features = rows[0].tokens.shape[-1]
        dtype = args[0][0].dtype
        return _MicroBatches(
            args=args,
            kwargs=kwargs,
            targets=targets,
            layouts=layouts,
            sigma=torch.cat(sigmas),
            tokens=sum(layout.total for layout in layouts),
            key=("packed", budget, features, dtype),
            input_shape=(1, budget, features),
            hidden_shape=(1, budget, cfg.hidden),
            output_shape=(1, budget, features),
            input_dtype=dtype,
            pad_to=budget,
        )

    # --- schedules ----------------------------------------------------------------------------------

    def _schedule_for(self, mbs: _MicroBatches):
        """The schedule for this step's shapes. Stages are built with static shapes (no inference run),
        and receive buffers are sized from them, so each distinct shape gets its own schedule; the few
        most recent are kept."""
        schedule = self._schedules.get(mbs.key)
        if schedule is not None:
            self._schedules.move_to_end(mbs.key)
            return schedule

        def meta(shape: tuple[int, ...], dtype: torch.dtype, grad: bool = True) -> torch.Tensor:
            # requires_grad marks which received activations get a gradient sent back
            return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)

        hidden = meta(mbs.hidden_shape, self.io.dtype)
        stages = []
        for index, module in zip(self.stage_ids, self.stage_modules, strict=True):
            first, last = index == 0, index == self.num_stages - 1
            stages.append(
                PipelineStage(
                    module,
                    index,
                    self.num_stages,
                    self.device,
                    input_args=meta(mbs.input_shape, mbs.input_dtype, grad=False) if first else hidden,
                    output_args=meta(mbs.output_shape, self.io.dtype) if last else hidden,
                    group=self.group,
                )
            )
        schedule = self.schedule_class(
            stages[0] if self.single_stage else stages,
            n_microbatches=self.microbatches,
            loss_fn=self._loss,
            scale_grads=False,
        )
        self._schedules[mbs.key] = schedule
        while len(self._schedules) > 4:
            self._schedules.popitem(last=False)
        return schedule

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Last stage: the micro-batch's mean squared error on the raw output, over the micro-batch
        count. Last-stage forwards run in micro-batch order, so the call count is the index."""
        index = self._loss_calls
        self._loss_calls += 1
        dtype = torch.promote_types(output.dtype, torch.float32)
        squared = (output.to(dtype) - target.to(dtype)).square()
        layout = self._current.layouts[index] if self._current is not None else None
        with torch.no_grad():
            if layout is None:
                per_sample = squared.flatten(1).mean(dim=1)
            else:
                per_token = squared.mean(dim=-1)[0]
                counts = torch.tensor(layout.seqlens, device=per_token.device, dtype=per_token.dtype)
                per_sample = per_token.new_zeros(layout.num_samples).index_add_(
                    0, layout.sample_index(per_token.device), per_token
                )
                per_sample = per_sample / counts
            self._per_sample.append(per_sample)
        return squared.mean() / self.microbatches

    # --- the step -------------------------------------------------------------------------------------

    def step(self, batch: BucketBatch | Sequence[PackedBatch]) -> MicroLoss:
        """Forward and backward of one batch through the pipeline; gradients land in the stage modules'
        `.grad` (added to what is there, like `loss.backward()`)."""
        if isinstance(batch, BucketBatch):
            mbs = self._bucket_micro_batches(batch)
        elif isinstance(batch, Sequence) and all(isinstance(row, PackedBatch) for row in batch):
            if not self.presplit:
                raise RuntimeError(
                    "pipeline parallel over packed rows needs torch's pre-split micro-batches "
                    "(schedule.step(arg_mbs=...), torch >= 2.12); set data.packing=false for bucket batches"
                )
            mbs = self._packed_micro_batches(batch)
        else:
            raise ValueError(
                f"PipelineTrainer.step takes a BucketBatch or a list of PackedBatch rows, got {type(batch).__name__}"
            )
        schedule = self._schedule_for(mbs)
        before = self._replicated_grads()
        losses: list[torch.Tensor] = []
        self._current, self._loss_calls, self._per_sample = mbs, 0, []
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
            self.io.active, self.io.pad_to, self._current = False, None, None
        self._sum_replicated_grads(before)
        return self._gather_loss(mbs, losses)

    @staticmethod
    def _whole_batch_step(schedule: Any, mbs: _MicroBatches, losses: list) -> None:
        """torch < 2.12: hand the schedule the whole batch and let it split every tensor along dim 0
        (the same even split `tensor_split` made); the token grid is replicated to each micro-batch."""
        kwargs = {
            name: torch.cat([kw[name] for kw in mbs.kwargs]) for name in mbs.kwargs[0] if name != "grid"
        }
        x = torch.cat([a[0] for a in mbs.args])
        target = torch.cat(mbs.targets)
        schedule.step(x, target=target, losses=losses, grid=mbs.kwargs[0]["grid"], **kwargs)

    def _gather_loss(self, mbs: _MicroBatches, losses: list[torch.Tensor]) -> MicroLoss:
        """Loss and per-sample losses from the last stage to every pp rank (one small all-reduce)."""
        n = mbs.sigma.shape[0]
        values = torch.zeros(1 + n, dtype=torch.float64, device=self.device)
        if self.has_last_stage:
            values[0] = torch.stack([loss.detach() for loss in losses]).sum()
            values[1:] = torch.cat(self._per_sample)
        dist.all_reduce(values, group=self.group)
        self._per_sample = []
        return MicroLoss(values[0], mbs.sigma.detach(), values[1:], mbs.tokens)

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
                if p.grad is not None and (index == 0 or name.startswith(STAGE_LOCAL_PREFIXES)):
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
