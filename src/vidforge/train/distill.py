"""`train.distill`: few-step distillation with DMD2 (Yin et al. 2024) as a `TrainStep`, so a distillation
runs through `vidforge train`'s build, loop, checkpoints, exact resume and export like any run.

Three networks (`vidforge.train.build`): the student (the run's model, trained: its optimizer, EMA and
export are the run's), the frozen teacher (the real score) and the fake score (trained on the student's
samples, its own AdamW at train.distill.fake_lr, checkpointed beside the model). Student and fake score
start from the teacher's weights. One training step (DMD2's two time-scale update rule, FastVideo's
`generator_update_interval` the other way round):

1. `fake_updates` times: the student generates (no gradient), the fake score takes one denoising step on
   those samples: the run's objective and `DenoisingLoss`, with the generated latents as the clean data;
2. the student generates with gradient; its samples are noised to a level drawn from the objective's
   training distribution; the fake score and the guided teacher (train.distill.guidance) denoise them,
   and DMD's gradient (`vidforge.diffusion.dmd`) is backpropagated through the student; the loop clips,
   steps and logs it as the step's loss (metrics also get `fake_loss`).

The student generates as it samples (`vidforge.diffusion.dmd.few_step_noisy`): one level of its
schedule is drawn per micro-batch, its input there is its own rollout from noise through the earlier
levels (no gradient), or with simulate=false the batch's latents noised to that level. Every draw comes
from torch's global CPU generator in one order, so a resumed run draws what an uninterrupted one would.

The student's schedule is written into the run's profile (`student_profile`: diffusion.sampler=few-step
over its levels, guidance 1), which the export carries: `vidforge infer` samples the student in its few
steps without flags. One process or data parallel (FSDP); the layout rulebook
(`vidforge.profile.layout_rules`) refuses context and pipeline parallel when the profile loads.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext

import torch
from torch import nn
from torch.profiler import record_function

from vidforge.data.batching import BucketBatch, PackedBatch
from vidforge.diffusion.dmd import dmd_gradient, dmd_loss, few_step_noisy
from vidforge.diffusion.from_profile import student_levels
from vidforge.diffusion.guidance import guided
from vidforge.parallel.runtime import Runtime
from vidforge.profile import RunProfile
from vidforge.profile.diffusion import FEW_STEP
from vidforge.profile.loading import validate_profile
from vidforge.sampling.shape import sampled_tokens
from vidforge.tokens import unpatchify
from vidforge.train.build import TrainParts
from vidforge.train.loss import TokenBatch
from vidforge.train.step import Batch, LocalTrainStep, StepLosses, clip_module


def student_profile(profile: RunProfile) -> RunProfile:
    """The profile with its sampling set to the student's: diffusion.sampler=few-step over the levels of
        train.distill (its own, or the objective's schedule at its step count and at infer's size, whose
    token count shifts it as the teacher's sampler under diffusion.flow_shift_tokens), without guidance. Applying it
        twice changes nothing."""
    distill = profile.train.distill
    if distill is None:
        return profile
    levels = distill.levels or student_levels(profile.diffusion, distill.steps, sampled_tokens(profile))
    data = profile.model_dump(mode="json")
    data["diffusion"] |= {
        "sampler": FEW_STEP,
        "few_step_levels": list(levels),
        "steps": len(levels),
        "guidance": 1.0,
    }
    return validate_profile(data, "train.distill")


class DistillTrainStep(LocalTrainStep):
    """One DMD2 step (see the module docstring) over train.grad_accum micro-batches."""

    def __init__(self, profile: RunProfile, runtime: Runtime, parts: TrainParts) -> None:
        super().__init__(profile, runtime, parts)
        distill = profile.train.distill
        if (
            distill is None
            or parts.teacher is None
            or parts.fake_score is None
            or parts.fake_optimizer is None
        ):
            raise ValueError(
                "DistillTrainStep needs a distillation profile and the parts build() made for it"
            )
        if profile.diffusion.sampler != FEW_STEP:
            raise ValueError("DistillTrainStep takes the student's profile (student_profile)")
        self.distill = distill
        self.teacher, self.fake_score, self.fake_optimizer = (
            parts.teacher,
            parts.fake_score,
            parts.fake_optimizer,
        )
        self.objective = self.loss.objective
        self.levels = profile.diffusion.few_step_levels
        self.renoise = profile.diffusion.few_step_noise
        # the fake score is a denoiser of the student's samples under their captions: no dropout
        self.fake_loss = dataclasses.replace(self.loss, caption_dropout=0.0)
        self.fake_lr_ratio = (distill.fake_lr or profile.train.lr) / profile.train.lr
        self.fake_updates_done = 0

    def set_lr(self, lr: float) -> None:
        super().set_lr(lr)
        for group in self.fake_optimizer.param_groups:
            group["lr"] = lr * self.fake_lr_ratio

    # --- the networks as denoisers ------------------------------------------------------------------------

    def _denoise(
        self, module: nn.Module, x: torch.Tensor, level: torch.Tensor, rows: TokenBatch, uncond: bool = False
    ) -> torch.Tensor:
        """`module`'s clean estimate at tokens x, levels (N,) per sample, with or without the captions."""
        n = level.shape[0]
        drop = torch.full((n,), uncond, dtype=torch.bool, device=x.device)

        def network(inputs: torch.Tensor, noise_level: torch.Tensor) -> torch.Tensor:
            with self._autocast():
                return module(
                    inputs, noise_level=noise_level, text=rows.text, text_mask=rows.text_mask,
                    drop_text=drop, **rows.where,
                )  # fmt: skip

        return self.objective.denoise(network, x, level, rows.per_sample(level))

    def _autocast(self):
        dtype = self.parts.compute_dtype
        return torch.autocast(self.device.type, dtype=dtype) if dtype else nullcontext()

    def _draw(self, like: torch.Tensor) -> torch.Tensor:
        """Standard normal noise shaped like `like`, from torch's global CPU generator (see the module
        docstring), on its device."""
        return torch.randn(like.shape, dtype=like.dtype).to(like.device)

    def generate(self, rows: TokenBatch) -> torch.Tensor:
        """The student's clean estimate at one level of its schedule (drawn), from the input sampling
        would give it there (`simulate`) or from the batch noised; with gradient where autograd is on."""
        n = rows.text.shape[0]
        index = int(torch.randint(len(self.levels), ()))
        noise = self._draw(rows.clean)

        def student(x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
            return self._denoise(self.model, x, level.expand(n), rows)

        level = torch.full((n,), self.levels[index], device=self.device)
        if self.distill.simulate:
            with torch.no_grad():
                x = few_step_noisy(
                    student, noise, self.levels, self.objective, index, self._draw, self.renoise
                )
        else:
            x = self.objective.corrupt(rows.clean, noise, rows.per_sample(level))
        return student(x, level[0])

    # --- the two updates ----------------------------------------------------------------------------------

    def fake_score_loss(self, batch: Batch, rows: TokenBatch) -> torch.Tensor:
        """The fake score's denoising loss on a fresh sample of the student (the run's objective)."""
        with torch.no_grad():
            generated = self.generate(rows)
        if isinstance(batch, PackedBatch):
            on_samples: Batch = dataclasses.replace(batch, tokens=generated)
        else:
            assert isinstance(batch, BucketBatch)
            model = self.profile.model
            latents = unpatchify(generated, rows.row, model.patch, model.in_channels)
            on_samples = dataclasses.replace(batch, latents=latents)
        inputs = self.fake_loss.draw(on_samples, self.device)
        with self._autocast():
            output = self.fake_score(inputs.x, **inputs.model_kwargs)
        return self.fake_loss.reduce(output, inputs).loss

    def dmd(self, rows: TokenBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The student's DMD loss on one micro-batch, with the levels its samples were noised to and each
        sample's loss."""
        generated = self.generate(rows)
        n = rows.text.shape[0]
        level = self.objective.sample_levels(n).to(self.device)
        noise = self._draw(generated)
        with torch.no_grad():
            noisy = self.objective.corrupt(generated.detach(), noise, rows.per_sample(level))
            fake = self._denoise(self.fake_score, noisy, level, rows)
            cond = self._denoise(self.teacher, noisy, level, rows)
            uncond = self._denoise(self.teacher, noisy, level, rows, uncond=True)
            real = guided(cond, uncond, self.distill.guidance)
        gradient = dmd_gradient(generated, real, fake, rows.sample_mean)
        per_sample = rows.sample_means(0.5 * gradient.square()).detach()
        return dmd_loss(generated, gradient), level, per_sample

    def forward_backward(self, batches: list[Batch]) -> StepLosses:
        rows = [self.loss.token_batch(batch, self.device) for batch in batches]
        fake_losses = []
        for _ in range(self.distill.fake_updates):
            with record_function("step.fake_score"):
                total = 0.0
                for batch, row in zip(batches, rows, strict=True):
                    loss = self.fake_score_loss(batch, row) / len(batches)
                    loss.backward()
                    total += float(loss.detach())
                norm = clip_module(
                    self.fake_score, self.profile.train.grad_clip or math.inf, self.runtime.dims.tp_enabled
                )
                if math.isfinite(total) and math.isfinite(norm):
                    self.fake_optimizer.step()
                    self.fake_updates_done += 1
                self.fake_optimizer.zero_grad(set_to_none=True)
                fake_losses.append(total)
        loss_sum, levels, per_sample = 0.0, [], []
        for row in rows:
            with record_function("step.model"):
                loss, level, samples = self.dmd(row)
            with record_function("step.backward"):
                (loss / len(rows)).backward()
            loss_sum += float(loss.detach()) / len(rows)
            levels.append(level)
            per_sample.append(samples)
        tokens = float(sum(row.tokens for row in rows))
        flops, hardware = map(sum, zip(*map(self.flops, batches), strict=True))
        return StepLosses(
            loss_sum,
            tokens,
            flops,
            hardware,
            torch.cat(levels),
            torch.cat(per_sample),
            {"fake_loss": sum(fake_losses) / len(fake_losses)},
        )

    def flops(self, batch: Batch) -> tuple[float, float]:
        """A step's model and hardware FLOPs on one micro-batch, with the student's rollouts counted at
        their mean length: fake_updates x (rollout + student forward + fake score forward and backward),
        then the rollout, the student's forward and backward, the fake score's forward and the teacher's
        two (conditional and unconditional)."""
        train, hardware = super().flops(batch)
        forward = float(self.flop_count(batch).forward)
        rollout = (len(self.levels) - 1) / 2 if self.distill.simulate else 0.0
        k = self.distill.fake_updates
        forwards = k * (rollout + 1) + rollout + 3
        return forwards * forward + (k + 1) * train, forwards * forward + (k + 1) * hardware
