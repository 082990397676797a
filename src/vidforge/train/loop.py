"""`vidforge train`: a DiT / ST-DiT on latent shards with the EDM loss.

Order of construction (torchtitan's): model -> pipeline split (pp > 1: this rank's stage modules) ->
per module: float8 linears -> tensor parallel -> context parallel -> activation checkpointing -> compile
-> FSDP2 -> EMA and one AdamW per module over its (sharded) parameters -> loader -> resume. Every rank
runs this function; under one process it runs without a process group.

Under pipeline parallel a step is one `PipelineTrainer.step` over parallel.pp_microbatches micro-batches
(packed rows: that many rows; bucketed: data.batch_size samples split evenly): the micro-batches are
the pipeline's gradient accumulation, so train.grad_accum stays 1."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vidforge.data.blending import DataParallelSizeChanged
from vidforge.data.loader import GroupComm, ShardLoader
from vidforge.data.packing import BucketBatch, PackedBatch, Packer, build_batcher
from vidforge.diffusion import EDM
from vidforge.errors import UserInputError
from vidforge.models import build_model, train_step_flops
from vidforge.parallel.dims import ParallelDims, init_distributed, profile_device
from vidforge.parallel.parallelize import autocast_dtype, parallelize
from vidforge.parallel.pipeline import PipelineTrainer
from vidforge.parallel.tensor_parallel import clip_grad_norm_ as tp_clip_grad_norm_
from vidforge.profile import RunProfile, dump_profile
from vidforge.train.checkpoint import CheckpointManager
from vidforge.train.ema import EMA
from vidforge.train.export import export_weights
from vidforge.train.lr import lr_multiplier
from vidforge.train.metrics import MetricsLog, loss_by_sigma, sigma_bucket_names
from vidforge.train.step import micro_batch_loss

Progress = Callable[[dict[str, Any]], None]


class TrainingDiverged(RuntimeError):
    """The loss or the gradients stopped being finite."""


@dataclass
class TrainSummary:
    run_dir: str
    start_step: int
    last_step: int
    final_loss: float | None
    skipped_steps: int
    tokens_per_s: float
    step_time_s: float
    mfu: float
    peak_memory_gib: float
    packing_efficiency: float | None
    export_dir: str | None
    notes: list[str] = field(default_factory=list)


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB: process RSS


def run(
    profile: RunProfile,
    data: Sequence[str | Path],
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: Progress | None = None,
) -> TrainSummary:
    cfg = profile.train
    device = profile_device(profile)
    rank, world = init_distributed(device.type)
    dims = ParallelDims.from_profile(profile)
    if world != dims.world_size:
        raise UserInputError(
            f"the layout {dims.layout.describe()} needs {dims.world_size} rank(s) but {world} started; "
            f"use --nproc {dims.world_size} or change cluster/parallel in the profile"
        )
    _check_layout(profile, dims)
    run_dir = Path(run_dir)
    checkpoints = CheckpointManager(run_dir, keep=cfg.keep_checkpoints, use_async=cfg.async_checkpoint)
    latest = checkpoints.latest()
    if latest is not None and not resume:
        raise UserInputError(
            f"{run_dir} already holds checkpoints (latest step {latest}); pass --resume or a new --run-dir"
        )
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "profile.yaml").write_text(dump_profile(profile))

    # --- model, parallelism, optimizer ---------------------------------------------------------------
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(profile.model, device=device)
    trainer: PipelineTrainer | None = None
    if dims.pp_enabled:  # split first; each stage module is then parallelized alone
        bf16 = cfg.precision == "bf16"
        trainer = PipelineTrainer(
            model,
            dims.mesh["pp"],
            profile,
            device,
            autocast_dtype=autocast_dtype(dims, profile),
            activation_dtype=torch.bfloat16 if bf16 else None,  # FSDP's param_dtype or autocast's
        )
        modules: list[torch.nn.Module] = list(trainer.stage_modules)
        del model
    else:
        modules = [model]
    notes: list[str] = []
    for module in modules:
        applied = parallelize(module, dims, profile, device)
        notes += [note for note in applied.notes if note not in notes]
    compute_dtype = applied.autocast_dtype  # what the forward autocasts to (None: FSDP casts, or fp32)
    cp_group = dims.mesh["cp"].get_group() if dims.cp_enabled else None
    ema = EMA(modules, cfg.ema_decay) if cfg.ema_decay > 0 else None
    # One optimizer per module (torchtitan's OptimizersContainer): checkpoints map each one's state to
    # its module's parameter names.
    optimizers = [
        torch.optim.AdamW(
            module.parameters(),
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=device.type == "cuda" or None,
        )
        for module in modules
    ]
    edm = EDM.from_profile(profile.diffusion)

    # --- data ---------------------------------------------------------------------------------------
    # Ranks of one model-parallel group (tp x cp x pp) share a dp rank, so they get the same samples;
    # the group reads each shard once and exchanges it.
    dp_rank = dims.flat("dp").get_local_rank() if dist.is_initialized() else 0
    mp_group = GroupComm(dims.model_parallel_group()) if dims.model_parallel > 1 else None
    loader = ShardLoader.from_profile(
        profile, [str(p) for p in data], dp_rank=dp_rank, dp_size=dims.layout.dp, group=mp_group
    )
    batcher = build_batcher(profile, loader)

    # --- resume -------------------------------------------------------------------------------------
    step = 0
    if resume and latest is not None:
        extra = checkpoints.load(latest, modules, optimizers, ema)
        step = extra["step"]
        notes.append(f"resumed from step {step}")
        try:
            batcher.load_state_dict(extra["loader"])
        except DataParallelSizeChanged as changed:
            # Weights and optimizer states reshard (DCP); a data position is per dp rank and cannot.
            notes.append(
                f"data-parallel size changed from {changed.saved} to {changed.now}: the model resumed "
                f"at step {step}, the data starts over from its first sample"
            )
    elif resume:
        notes.append("no complete checkpoint to resume from: started fresh")
    start_step = step
    metrics = MetricsLog(run_dir, enabled=rank == 0, resume_step=step)
    recompute = "full" if cfg.activation_checkpointing == "full" else "none"
    peak = profile.cluster.accelerator.peak_bf16_flops

    skipped_in_row = skipped = 0
    last_loss: float | None = None
    window = {"time": 0.0, "tokens": 0.0, "flops": 0.0, "steps": 0}
    buckets: dict[str, list[float]] = {name: [0.0, 0.0] for name in sigma_bucket_names()}
    step_time = tokens_per_s = mfu = 0.0
    exhausted = False
    for module in modules:
        module.train()

    def zero_grad() -> None:
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)

    while step < cfg.steps:
        started = time.perf_counter()
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * lr_multiplier(step, cfg)
        loss_sum = tokens = flops = 0.0
        if trainer is not None:  # forward and backward of every micro-batch through the pipeline
            batches = _pipeline_batches(batcher, profile)
            exhausted = batches is None
            if batches is not None:
                micro = trainer.step(batches[0] if isinstance(batches[0], BucketBatch) else batches)
                loss_sum = micro.loss.item()
                tokens = float(micro.tokens)
                for batch in batches:
                    flops += _flops(batch, profile, recompute)
                for name, (total, n) in loss_by_sigma(micro.sigma, micro.per_sample).items():
                    buckets[name][0] += total
                    buckets[name][1] += n
        for _ in range(cfg.grad_accum if trainer is None else 0):
            batch = batcher.next_batch()
            if batch is None:
                exhausted = True
                break
            micro = micro_batch_loss(
                modules[0], edm, batch, profile.diffusion.caption_dropout, device, compute_dtype, cp_group
            )
            # Under context parallel each rank's loss is its share of the mean and FSDP averages the
            # gradients over dp_shard x cp: scale by cp so the cp shares add up instead.
            (micro.loss * dims.layout.cp / cfg.grad_accum).backward()
            loss_sum += micro.loss.item() / cfg.grad_accum
            tokens += micro.tokens
            flops += _flops(batch, profile, recompute)
            for name, (total, n) in loss_by_sigma(micro.sigma, micro.per_sample).items():
                buckets[name][0] += total
                buckets[name][1] += n
        if exhausted:
            zero_grad()
            notes.append(f"data ran out at step {step} (data.epochs={profile.data.epochs})")
            break
        if trainer is not None:  # the whole model's norm over the pp group, replicated parameters once
            grad_norm = trainer.clip_grad_norm_(cfg.grad_clip or math.inf)
        elif dims.tp_enabled:  # parameters on several meshes; partial gradients reduced first
            grad_norm = tp_clip_grad_norm_(modules[0].parameters(), cfg.grad_clip or math.inf)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(modules[0].parameters(), cfg.grad_clip or math.inf)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        loss_sum, tokens, flops = _all_reduce_sum([loss_sum, tokens, flops], device)
        # Summed over every rank: the cp shares add up to each micro-batch's loss, tp ranks hold copies
        # of it, and so do pp ranks (the last stage's loss is sent to the whole pipeline); tokens and
        # FLOPs are counted once per model-parallel group member.
        loss_mean = loss_sum / (dims.layout.dp * dims.layout.tp * dims.layout.pp)
        tokens /= dims.model_parallel
        flops /= dims.model_parallel
        if not (math.isfinite(loss_mean) and math.isfinite(grad_norm)):
            zero_grad()
            what = f"step {step}: loss {loss_mean}, gradient norm {grad_norm}"
            skipped += 1
            skipped_in_row += 1
            if cfg.nan_policy == "stop" or skipped_in_row > cfg.max_skipped_steps:
                raise TrainingDiverged(
                    f"{what}; lower train.lr, keep train.grad_clip on, or set train.nan_policy=skip "
                    f"(skipped {skipped} step(s) so far)"
                )
            notes.append(f"skipped {what}")
            step += 1
            continue
        skipped_in_row = 0
        for optimizer in optimizers:
            optimizer.step()
        zero_grad()
        if ema is not None:
            ema.update(modules)
        step += 1
        last_loss = loss_mean
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
        window["time"] += elapsed
        window["tokens"] += tokens
        window["flops"] += flops
        window["steps"] += 1

        if step % cfg.log_every == 0 or step == cfg.steps:
            step_time = window["time"] / window["steps"]
            tokens_per_s = window["tokens"] / window["time"]
            mfu = window["flops"] / (window["time"] * world * peak)
            record = {
                "step": step,
                "loss": loss_mean,
                "grad_norm": grad_norm,
                "lr": optimizers[0].param_groups[0]["lr"],
                "step_time_s": step_time,
                "tokens_per_s": tokens_per_s,
                "mfu": mfu,
                "peak_memory_gib": _peak_memory_gib(device),
                **{name: total / count for name, (total, count) in buckets.items() if count},
            }
            if hasattr(batcher, "efficiency"):
                record["packing_efficiency"] = batcher.efficiency
            metrics.write(record)
            if progress is not None and rank == 0:
                progress(record)
            window = {"time": 0.0, "tokens": 0.0, "flops": 0.0, "steps": 0}
            buckets = {name: [0.0, 0.0] for name in sigma_bucket_names()}
        if step % cfg.save_every == 0 or step == cfg.steps:
            checkpoints.save(step, modules, optimizers, ema, {"loader": batcher.state_dict()})
        if cfg.validate_every and step % cfg.validate_every == 0:
            from vidforge.train.validation import validate

            validate(profile, modules[0], ema, run_dir / "validation" / f"step_{step:08d}", rank)

    if step > start_step and (step % cfg.save_every and step != cfg.steps):
        checkpoints.save(step, modules, optimizers, ema, {"loader": batcher.state_dict()})
    checkpoints.wait()
    export_dir = None
    if step > 0:
        pp_group = trainer.group if trainer is not None else None
        export_dir = export_weights(profile, modules, ema, run_dir / "export", rank, pp_group=pp_group)
    metrics.close()
    efficiency = getattr(batcher, "efficiency", None)
    return TrainSummary(
        run_dir=str(run_dir),
        start_step=start_step,
        last_step=step,
        final_loss=last_loss,
        skipped_steps=skipped,
        tokens_per_s=tokens_per_s,
        step_time_s=step_time,
        mfu=mfu,
        peak_memory_gib=_peak_memory_gib(device),
        packing_efficiency=efficiency,
        export_dir=str(export_dir) if export_dir else None,
        notes=notes,
    )


def _check_layout(profile: RunProfile, dims: ParallelDims) -> None:
    """Refuse, before anything is built, what pipeline parallel training does not do."""
    if not dims.pp_enabled:
        return
    pp = f"parallel.pp={dims.layout.pp}"
    if dims.cp_enabled:
        raise UserInputError(
            f"{pp} with parallel.cp={dims.layout.cp}: the pipeline does not split token rows over cp "
            "ranks; use pp with dp_shard/dp_replicate (and tp), or cp without pp"
        )
    if profile.train.grad_accum > 1:
        raise UserInputError(
            f"{pp} with train.grad_accum={profile.train.grad_accum}: the pipeline's micro-batches are its "
            "gradient accumulation; set train.grad_accum=1 and raise parallel.pp_microbatches instead"
        )
    if not profile.data.packing and profile.data.batch_size % dims.layout.pp_microbatches:
        raise UserInputError(
            f"data.batch_size={profile.data.batch_size} with parallel.pp_microbatches="
            f"{dims.layout.pp_microbatches}: the pipeline splits each batch evenly into its micro-batches; "
            "make data.batch_size a multiple of pp_microbatches"
        )
    from vidforge.train.validation import check_supported

    check_supported(profile)


@torch.no_grad()
def _pipeline_batches(batcher: Any, profile: RunProfile) -> list[PackedBatch] | list[BucketBatch] | None:
    """One pipeline step's data: parallel.pp_microbatches packed rows, or one bucket batch (split by the
    pipeline). None when the data ran out, also when the last bucket batch is too small to split evenly."""
    if isinstance(batcher, Packer):
        rows = []
        for _ in range(profile.layout.pp_microbatches):
            row = batcher.next_batch()
            if row is None:
                return None
            rows.append(row)
        return rows
    batch = batcher.next_batch()
    if batch is None or batch.latents.shape[0] % profile.layout.pp_microbatches:
        return None
    return [batch]


def _flops(batch: PackedBatch | BucketBatch, profile: RunProfile, recompute: str) -> float:
    text_lens = batch.text_mask.sum(dim=1).tolist()
    grids = batch.layout if isinstance(batch, PackedBatch) else _batch_grids(batch, profile)
    return train_step_flops(profile.model, grids, text_lens, recompute)


def _batch_grids(batch: Any, profile: RunProfile) -> list[tuple[int, int, int]]:
    pt, ph, pw = profile.model.patch
    b, _, t, h, w = batch.latents.shape
    return [(t // pt, h // ph, w // pw)] * b


def summary_dict(summary: TrainSummary) -> dict[str, Any]:
    return asdict(summary)
