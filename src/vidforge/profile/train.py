"""`train`: the optimisation loop of `vidforge train` (schedule, precision, memory, checkpoints, metrics)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.section import Section


class Lora(Section):
    """LoRA fine-tuning with peft: low-rank adapters on the named linear layers; every other weight
    frozen in the compute dtype, the adapters trained (and checkpointed, exported) in fp32."""

    rank: int = Field(16, ge=1)
    """Rank r of each adapter (lora_A: r x in, lora_B: out x r)."""
    alpha: float = Field(16.0, gt=0)
    """Scale numerator: the adapter's output is multiplied by alpha / rank."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training."""
    target_modules: tuple[str, ...] | None = None
    """Module names (peft's suffix match, e.g. `to_q`) that get adapters; None: the family's attention
    projections (each family's `FamilySpec.lora_targets`: wan `to_q`, `to_k`, `to_v`, `to_out.0`; the
    vidforge DiT `q`, `k`, `v`, `out`)."""
    fp8_base: bool = False
    """Store the blocks' frozen linear weights in float8 e4m3 with a float32 scale (`fp8_scaling`), half of
    bf16's bytes; each layer computes in the compute dtype from its weight dequantized on the fly
    (`vidforge.memory_savers.fp8_base`). The adapters, norms, embeddings and the final layer keep their dtype."""
    fp8_scaling: Literal["row", "tensor"] = "row"
    """With fp8_base: one scale per output row (the smaller error) or one per weight."""
    blocks_to_swap: int = Field(0, ge=0)
    """Transformer blocks whose frozen weights wait in pinned host memory and come to the device one block
    ahead of their use, on a side stream (`vidforge.memory_savers.block_swap`); the last blocks of the model.
    Under FSDP2 each rank's shards of them (with their adapters, which step on the host) wait there, each
    block all-gathered one ahead (`vidforge.parallel.fsdp.apply_fsdp`)."""


class Distill(Section):
    """Few-step distillation with DMD2 (Yin et al. 2024; FastVideo's recipe for Wan): the trained model is
    a student initialised from a frozen teacher; a fake score network, also initialised from the teacher,
    learns the denoiser of the student's own samples; the student follows DMD's gradient, the difference
    of the fake score's and the guided teacher's clean estimates on its noised samples
    (`vidforge.diffusion.dmd`, `vidforge.train.distill`). The run's profile and export sample with the
    student's levels (diffusion.sampler=few-step), so `vidforge infer` needs no flags."""

    teacher: str | None = None
    """The teacher's weights: a vidforge export or run, or a diffusers Wan folder (what --init takes); None:
    the run's --init. The student and the fake score start from them (the student from --init when both
    are given)."""
    steps: int = Field(4, ge=1)
    """The student's sampling steps (one model call each, no guidance)."""
    levels: tuple[float, ...] | None = None
    """The student's noise levels (sigma, or flow time), decreasing from where sampling starts; None: the
    objective's sampling schedule (`vidforge.diffusion.from_profile.student_levels`: flow times from 1,
    shifted by diffusion.flow_shift, or by flow_shift_tokens' shift at infer's size; EDM's Karras sigmas
    from sigma_max, short of sigma_min)."""
    guidance: float = Field(5.0, ge=0)
    """Classifier-free guidance of the teacher (the real score); the student learns the guided
    distribution and samples without guidance."""
    fake_updates: int = Field(5, ge=1)
    """Fake-score updates per student update (DMD2's two time-scale rule: the fake score keeps up with the
    student's moving distribution); each training step is this many fake-score updates, then one of the
    student."""
    fake_lr: float | None = Field(None, gt=0)
    """The fake score's peak learning rate (it follows train.lr's schedule); None: train.lr."""
    simulate: bool = True
    """The student's input at a step of its schedule: its own rollout from noise through the earlier
    steps (DMD2's backward simulation: training sees what sampling gives it, and needs no clean data), or
    the batch's latents noised to that level (false)."""
    fp8_teacher: bool = False
    """Store the frozen teacher's block linear weights in float8 e4m3 (row scales), half of bf16's bytes
    (`vidforge.memory_savers.fp8_base`)."""

    @model_validator(mode="after")
    def _check(self) -> Distill:
        levels = self.levels or ()
        if any(v <= 0 for v in levels) or any(a <= b for a, b in zip(levels, levels[1:], strict=False)):
            raise ValueError(
                f"levels: the student's noise levels must be positive and decreasing, got {list(levels)}"
            )
        if self.levels is not None and len(self.levels) != self.steps:
            raise ValueError(
                f"levels: {len(self.levels)} given for steps={self.steps}; set steps={len(self.levels)}"
            )
        return self


class Train(Section):
    """What one training run does. Global batch = micro_batch x grad_accum x data-parallel ranks."""

    steps: int = Field(1000, ge=1)
    """Optimizer steps to run."""
    micro_batch: int = Field(1, ge=1)
    """Samples (or packed sequences) per rank per forward/backward."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches accumulated per optimizer step."""
    lr: float = Field(1e-4, gt=0)
    """Peak learning rate of AdamW."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Cosine schedule floor as a fraction of lr."""
    warmup_steps: int = Field(100, ge=0)
    """Linear warm-up from 0 to lr."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """After warm-up: cosine decay to min_lr_ratio x lr at the last step, or constant."""
    resume_schedule: Literal["keep", "refit"] = "keep"
    """On --resume with a changed lr, warmup_steps, schedule, min_lr_ratio or steps: keep the schedule the
    checkpoint was trained with (more steps after a finished cosine go on at its floor), or refit the
    profile's from the resumed step on (`train --reschedule`). Either way the run says so in one line."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this; 0 disables clipping."""
    precision: Literal["bf16", "fp32"] = "bf16"
    """Compute dtype. bf16 keeps fp32 master weights and optimizer states (FSDP mixed precision). fp32 is
    full fp32 on CUDA too (no TF32 in matmuls or cuDNN convolutions), so a GPU run follows the CPU's;
    bf16 lets the float32 matmuls left use TF32."""
    ema_decay: float = Field(0.999, ge=0, lt=1)
    """Exponential moving average of the weights kept for sampling; 0 disables it."""
    activation_checkpointing: Literal["none", "full", "selective", "auto"] = "none"
    """Recompute activations in the backward: none, every block (full), a ratio of blocks in full and a ratio
    at op level (selective: checkpoint_ratio, checkpoint_ops_ratio), or auto: the least recompute the memory
    model finds fits cluster.accelerator (within bench.memory_headroom), per block from full to op level to
    none (`vidforge.estimate.recompute`; `train --dry-run` and `bench plan` show the choice)."""
    checkpoint_ratio: float = Field(0.5, ge=0, le=1)
    """With selective checkpointing, the fraction of blocks that recompute in full (keep only their input)."""
    checkpoint_ops_ratio: float = Field(0.0, ge=0, le=1)
    """With selective checkpointing, the fraction of blocks that recompute at op level: they keep their
    matmuls' and attention kernels' outputs and recompute the norms, modulation and elementwise ops
    between them (torch's selective activation checkpointing), chosen among the blocks not recomputed in
    full: checkpoint_ratio + checkpoint_ops_ratio <= 1."""
    activation_offload: float = Field(0.0, ge=0, le=1)
    """Fraction of the blocks whose saved activations wait for the backward in pinned CPU memory, copied on
    a side stream and brought back ahead of the backward (Vchitect-2.0). Chosen among the blocks that do
    not recompute: with selective checkpointing, checkpoint_ratio + activation_offload <= 1."""
    checkpoint_offload: bool = False
    """With activation checkpointing: the input each recomputing block keeps for its backward waits in
    pinned CPU memory too, copied on the side stream and brought back one block ahead of its recompute
    (musubi-tuner's activation CPU offloading with gradient checkpointing). Under full recompute the blocks
    then keep nothing on the device between the forward and the backward."""
    compile: bool = False
    """torch.compile each block (GPU; on CPU inductor's C++ build of the tiny model takes minutes)."""
    fp8: bool = False
    """FP8 matmuls in the linear layers that train (torchao float8, dynamic scaling by fp8_recipe): CUDA GPUs
    with compute capability >= 8.9 and torchao (the `gpu` extra) only. Layers with a dim not a multiple of
    16 and the final layer stay in high precision; token counts that are not are padded with zeros for the
    matmul (exact). Pays off with train.compile=true on large models."""
    fp8_recipe: Literal["rowwise", "tensorwise"] = "rowwise"
    """With fp8: one float8 scale per row of each matmul operand (rowwise, power-of-two scales: an outlier
    costs only its row's precision) or one per tensor (tensorwise: the fastest kernel)."""
    fsdp_cpu_offload: bool = False
    """Keep FSDP-sharded parameters, gradients and optimizer states in CPU memory (FSDP2's CPUOffloadPolicy,
    pinned on GPUs); the optimizer steps there. With LoRA: tested on two gloo ranks."""
    seed: int = 0
    """Seed of weights, noise, caption dropout and the loader's shuffle."""
    save_every: int = Field(100, ge=1)
    """Steps between checkpoints (one is also written at the end)."""
    keep_checkpoints: int = Field(3, ge=1)
    """Complete checkpoints kept; older ones are deleted once a newer one is complete."""
    async_checkpoint: bool = False
    """Write checkpoints in the background (torch.distributed.checkpoint async_save)."""
    log_every: int = Field(10, ge=1)
    """Steps between metric lines."""
    nan_policy: Literal["stop", "skip"] = "stop"
    """On a NaN/inf loss or gradient: stop the run with a message, or skip the step and go on."""
    max_skipped_steps: int = Field(10, ge=0)
    """With nan_policy=skip, stop anyway after this many skipped steps in a row."""
    validate_every: int | None = Field(None, ge=0)
    """Steps between validation samples from the EMA model; 0 disables. None: off for a run from scratch,
    on for a fine-tune (--init or train.lora): four times over the run and at its last step."""
    validation_prompts: tuple[str, ...] = ()
    """Prompts the periodic validation samples; empty: the first few distinct captions of the training data."""
    trackers: tuple[Literal["tensorboard", "wandb"], ...] = ("tensorboard",)
    """Where metrics and validation samples go besides RUN/metrics.jsonl and RUN/validation/: TensorBoard
    (RUN/tensorboard/) and Weights & Biases (`pip install wandb`; project $WANDB_PROJECT or `vidforge`,
    the run named after its directory and continued by --resume; WANDB_MODE=offline keeps it on disk)."""
    expert: Literal["high", "low"] | None = None
    """A two-expert model (model.experts=2, Wan2.2 A14B): the one expert this run trains, on its own range
    of the flow time only (`high`: t >= model.boundary_ratio, diffusers' `transformer`; `low`: below it,
    `transformer_2`), starting from that expert's weights with --init. None for a one-expert model."""
    lora: Lora | None = None
    """LoRA fine-tuning (adapters on a frozen base, usually with --init); None: every weight trains."""
    distill: Distill | None = None
    """Few-step distillation of a teacher (DMD2); None: a denoising run. With train.lora, the student and
    the fake score each train their own adapters on the teacher's weights."""

    @model_validator(mode="after")
    def _check(self) -> Train:
        if self.warmup_steps >= self.steps and self.steps > 1:
            raise ValueError(f"warmup_steps: must be below train.steps={self.steps}, got {self.warmup_steps}")
        recomputed = {"none": 0.0, "full": 1.0, "selective": self.checkpoint_ratio, "auto": 0.0}[
            self.activation_checkpointing
        ]
        if (
            self.activation_checkpointing == "selective"
            and self.checkpoint_ratio + self.checkpoint_ops_ratio > 1 + 1e-9
        ):
            raise ValueError(
                f"checkpoint_ops_ratio: {self.checkpoint_ops_ratio:g} of the blocks at op level plus "
                f"checkpoint_ratio={self.checkpoint_ratio:g} in full exceeds every block: lower one of them"
            )
        if self.activation_offload > 0 and recomputed + self.activation_offload > 1 + 1e-9:
            # Vchitect-2.0's "combination": a block recomputes or offloads, never both
            raise ValueError(
                f"activation_offload: {self.activation_offload:g} of the blocks offloaded plus {recomputed:g} "
                f"recomputed (activation_checkpointing={self.activation_checkpointing}) exceeds every block; "
                "offloaded blocks are chosen among those that do not recompute: lower one of them"
            )
        if self.checkpoint_offload and self.activation_checkpointing == "none":
            raise ValueError(
                "checkpoint_offload: offloads the inputs that recomputing blocks keep; set "
                "train.activation_checkpointing=full (or selective), or leave checkpoint_offload false"
            )
        return self
