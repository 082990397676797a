"""Distribution matching distillation (DMD2: Yin et al. 2024, "Improved Distribution Matching Distillation
for Fast Image Synthesis") as weightless math: the generator's gradient and the few-step sampler it is
trained for. The networks (student, frozen teacher, fake score) and their updates live in
`vidforge.train.distill`.

The generator G maps noise to samples x. DMD lowers KL(p_fake || p_real) between the distribution of its
samples and the data's, both diffused to a noise level t: x_t = alpha_t x + sigma_t n. Its gradient is

    grad_theta KL = E_t,n [ -(s_real(x_t) - s_fake(x_t)) dx/dtheta ],

with s the scores of the two diffused distributions. A denoiser's clean estimate x0_hat gives its score,
s(x_t) = -(x_t - alpha_t x0_hat(x_t)) / sigma_t^2, so s_real - s_fake = alpha_t (real_x0 - fake_x0) /
sigma_t^2: the gradient with respect to the sample points along fake_x0 - real_x0, where real_x0 is the
frozen teacher's (guided) estimate and fake_x0 that of a denoiser trained on the generator's own samples.
DMD's weight replaces alpha_t / sigma_t^2 by 1 / mean|x - real_x0| per sample, which keeps the step
size alike at every t:

    g = (fake_x0 - real_x0) / mean_sample |x - real_x0|.

`dmd_loss` is the surrogate 0.5 mean (x - sg(x - g))^2, whose gradient in x is g / numel: autograd
carries g through the generator without differentiating the two score networks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from vidforge.diffusion.objective import Denoiser, Objective

SampleMean = Callable[[torch.Tensor], torch.Tensor]
"""A tensor -> each sample's mean, broadcast back against it (a plain batch: the mean over every dim but
the first; a packed row: over each sample's tokens)."""

Draw = Callable[[torch.Tensor], torch.Tensor]
"""Fresh standard normal noise shaped like its argument."""


def batch_mean(x: torch.Tensor) -> torch.Tensor:
    """The `SampleMean` of a plain batch (B, ...)."""
    return x.mean(dim=tuple(range(1, x.ndim)), keepdim=True)


def dmd_gradient(
    generated: torch.Tensor,
    real_x0: torch.Tensor,
    fake_x0: torch.Tensor,
    sample_mean: SampleMean = batch_mean,
) -> torch.Tensor:
    """DMD's gradient on the generator's samples (see the module docstring), in float32 or wider; a
    sample on which the teacher agrees exactly (mean |x - real_x0| = 0) gets none rather than NaN."""
    dtype = torch.promote_types(generated.dtype, torch.float32)
    x, real, fake = (t.detach().to(dtype) for t in (generated, real_x0, fake_x0))
    return torch.nan_to_num((fake - real) / sample_mean((x - real).abs()), nan=0.0, posinf=0.0, neginf=0.0)


def dmd_loss(generated: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """The scalar whose gradient in `generated` is `gradient` / generated.numel()."""
    x = generated.to(gradient.dtype)
    return 0.5 * (x - (x - gradient).detach()).square().mean()


FEW_STEP_NOISE = ("fresh", "implied")
"""How the few-step sampler noises each clean estimate to the next level (`diffusion.few_step_noise`)."""


def few_step_noisy(
    denoise: Denoiser,
    noise: torch.Tensor,
    levels: Sequence[float],
    objective: Objective,
    upto: int,
    draw: Draw,
    renoise: str,
) -> torch.Tensor:
    """The few-step sampler's input at `levels[upto]`: pure noise at levels[0] (objective.corrupt of
    nothing: sigma_0 n under EDM, n itself at flow time 1), then per step the clean estimate at the
    current level, noised to the next: with fresh noise from `draw` (renoise="fresh", DMD2's multi-step
    generator), or with the noise its input implies (renoise="implied": a DDIM step, so that over levels
    L the sampler is the deterministic Euler/DDIM sampler over L and 0). The student is trained on these
    inputs (`train.distill.simulate`), so training sees what sampling gives it."""
    if renoise not in FEW_STEP_NOISE:
        raise ValueError(f"renoise must be one of {FEW_STEP_NOISE}, got {renoise!r}")
    x = objective.corrupt(torch.zeros_like(noise), noise, _level(levels[0], noise))
    for i in range(upto):
        level = _level(levels[i], x)
        clean = denoise(x, level)
        n = draw(clean) if renoise == "fresh" else objective.implied_noise(x, clean, level)
        x = objective.corrupt(clean, n, _level(levels[i + 1], x))
    return x


def few_step_sampler(
    denoise: Denoiser,
    noise: torch.Tensor,
    levels: Sequence[float],
    objective: Objective,
    draw: Draw,
    renoise: str,
) -> torch.Tensor:
    """A few-step student's sample: the clean estimate at the last of `levels` (decreasing, the first
    where sampling starts from pure noise), one denoiser call per level; `renoise` as in
    `few_step_noisy`. The output is that last clean estimate, not a noisy sample at the last level."""
    last = len(levels) - 1
    x = few_step_noisy(denoise, noise, levels, objective, last, draw, renoise)
    return denoise(x, _level(levels[last], x))


def _level(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=like.dtype, device=like.device)
