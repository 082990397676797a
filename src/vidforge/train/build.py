"""What a training run is made of, built once: the model (or this rank's pipeline stages), parallelized,
with its EMA and optimizers. `vidforge train` and `vidforge bench train` both build through here.

Order of construction (torchtitan's): model -> pipeline split (pp > 1: this rank's stage modules) ->
per module: float8 linears -> tensor parallel -> context parallel -> activation checkpointing -> compile
-> FSDP2 (`vidforge.parallel.parallelize`) -> EMA and one AdamW per module over its (sharded) parameters.
With `--init`, the weights are loaded into the whole model right after it is built; with `train.lora`,
the model is then frozen and given its adapters (`vidforge.lora`), before any split or sharding.
Under `train.distill` two more networks are built the same way from the teacher's weights: the frozen
teacher and the fake score (its own adapters under LoRA, its own AdamW), each parallelized alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from vidforge.errors import UserInputError
from vidforge.lora import apply_lora
from vidforge.memory_savers.fp8_base import apply_fp8_base
from vidforge.models import build_model
from vidforge.models.cpu_draws import cpu_draws
from vidforge.parallel.parallelize import autocast_dtype, compute_dtype, parallelize, reduced_dtype
from vidforge.parallel.pipeline import PipelineRunner
from vidforge.parallel.runtime import Runtime
from vidforge.profile import RunProfile
from vidforge.profile.train import Lora
from vidforge.train.ema import EMA, tensor_kind
from vidforge.train.experts import require_expert
from vidforge.train.init_weights import WeightsInit, init_from


@dataclass
class TrainParts:
    """The trainable state of one rank."""

    modules: list[nn.Module]  # the model, or this rank's pipeline stage modules
    optimizers: list[torch.optim.Optimizer]  # one per module (checkpoints map each to its module's names)
    ema: EMA | None
    compute_dtype: torch.dtype | None  # what the forward autocasts to (None: fp32)
    pipeline: PipelineRunner | None = None
    notes: list[str] = field(default_factory=list)
    # train.distill: the frozen teacher, and the fake score with its own optimizer
    teacher: nn.Module | None = None
    fake_score: nn.Module | None = None
    fake_optimizer: torch.optim.Optimizer | None = None

    def companions(self) -> dict[str, tuple[nn.Module, torch.optim.Optimizer]]:
        """Trained networks besides the model, by the name their checkpoint state is saved under."""
        if self.fake_score is None or self.fake_optimizer is None:
            return {}
        return {"fake_score": (self.fake_score, self.fake_optimizer)}


def build(
    profile: RunProfile, runtime: Runtime, init: WeightsInit | None = None, teacher: WeightsInit | None = None
) -> TrainParts:
    """Build and parallelize the profile's model on this rank, with its EMA and AdamW optimizers; with
    `init`, its weights first loaded from there (`vidforge.train.init_weights`). Under train.distill also
    the fake score (from the teacher's weights, trained like the model) and the frozen `teacher`."""
    cfg, dims, device = profile.train, runtime.dims, runtime.device
    require_expert(profile)
    use_tf32(cfg.precision == "bf16")
    notes: list[str] = []
    model = _model(profile, runtime, init, cfg.lora, notes)
    autocast = autocast_dtype(profile)
    pipeline = None
    modules: list[nn.Module] = [model]
    if dims.pp_enabled:  # split first; each stage module is then parallelized alone
        pipeline = PipelineRunner(
            model,
            dims.mesh["pp"],
            dims.layout,
            profile.parallel.pp_schedule,
            device,
            autocast_dtype=autocast,
            # the activations sent between stages: autocast's (FSDP's param_dtype)
            activation_dtype=reduced_dtype(profile),
        )
        modules = list(pipeline.stage_modules)
        del model
    for module in modules:
        applied = parallelize(module, dims, profile, device)
        notes += [note for note in applied.notes if note not in notes]
    ema = EMA(modules, cfg.ema_decay) if cfg.ema_decay > 0 else None
    optimizers = [_adamw(module, cfg.lr, profile, device) for module in modules]
    parts = TrainParts(modules, optimizers, ema, autocast, pipeline, notes)
    if cfg.distill is not None:
        # `vidforge train` passes the teacher's weights; the dry run builds on the meta device, where no
        # weights load and the teacher is the model's shapes; `bench train` has none to give
        if teacher is None and device.type != "meta":
            raise UserInputError(
                "train.distill: this command builds no teacher; run `vidforge train` with the profile, or "
                "drop train.distill (--set train.distill=null) to measure the model alone"
            )
        parts.teacher = _model(profile, runtime, teacher, None, notes, "teacher: ")
        parts.teacher.requires_grad_(False).eval()
        if cfg.distill.fp8_teacher:
            notes.append("teacher: " + apply_fp8_base(parts.teacher))
        parallelize(parts.teacher, dims, profile, device)
        parts.fake_score = _model(profile, runtime, teacher, cfg.lora, notes, "fake score: ")
        parallelize(parts.fake_score, dims, profile, device)
        parts.fake_optimizer = _adamw(parts.fake_score, cfg.distill.fake_lr or cfg.lr, profile, device)
    return parts


def _model(
    profile: RunProfile,
    runtime: Runtime,
    init: WeightsInit | None,
    lora: Lora | None,
    notes: list[str],
    name: str = "",
) -> nn.Module:
    """One network of the run, before any parallelism: built from train.seed, loaded from `init`, given
    `lora`'s adapters (and its float8 base)."""
    device = runtime.device
    # identical initial weights on every rank, and on every device (drawn on the CPU: build_model)
    torch.manual_seed(profile.train.seed)
    model = build_model(profile.model, device=device)
    if init is not None:  # before any split or sharding: every layout starts from the same weights
        notes.append(
            name + init_from(model, init.src, init.allow_partial, init.raw, profile.train.expert).describe()
        )
    if lora is not None:  # the frozen base and its adapters are what every layout below is handed
        # the adapters' initialisation, as the model's
        with cpu_draws(device, lambda: sum(p.numel() for p in model.parameters())):
            notes.append(name + apply_lora(model, lora, compute_dtype(profile)))
        if lora.fp8_base:
            notes.append(name + apply_fp8_base(model, lora.fp8_scaling))
    return model


def _adamw(module: nn.Module, lr: float, profile: RunProfile, device: torch.device) -> torch.optim.Optimizer:
    cfg = profile.train
    return torch.optim.AdamW(
        same_kind_groups(p for p in module.parameters() if p.requires_grad),  # LoRA: the adapters alone
        lr=lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        # fused where torch has the kernel: on the CPU too, where it is 3.5x the default per-tensor
        # loop (3.3M parameters, one thread: 5.8 vs 20.5 ms a step)
        fused=device.type in ("cuda", "cpu") or None,
    )


def same_kind_groups(params: Iterable[nn.Parameter]) -> list[dict]:
    """Parameter groups of one `tensor_kind` each: the fused AdamW step runs per group and refuses a mix
    of plain tensors and DTensors, or DTensors of several meshes (tensor parallel, with or without FSDP2)."""
    groups: dict[tuple, list[nn.Parameter]] = {}
    for p in params:
        groups.setdefault(tensor_kind(p), []).append(p)
    return [{"params": group} for group in groups.values()]


def use_tf32(allowed: bool) -> None:
    """Whether CUDA's float32 matmuls and cuDNN convolutions may round their inputs to TF32 (10 mantissa
    bits), decided here for every training run: not under train.precision=fp32, the reference precision
    that layouts, resumes and the GPU are held to the CPU in (TF32 errors of about 1e-3 would exceed
    those tolerances; torch's defaults differ between the two: matmuls off, convolutions on); yes under
    bf16, whose compute is coarser still and where the few float32 matmuls left gain TF32's speed."""
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed
