"""Rectified flow (Liu et al. 2022; Esser et al. 2024, SD3; Wan2.1), the second `Objective` beside EDM.

Training: x_t = (1 - t) x0 + t noise for t in [0, 1], and the network predicts the velocity
v = noise - x0 (diffusers' "flow_prediction") from x_t itself, with an unweighted squared error; the
clean estimate is x0 = x_t - t v. t is drawn uniform or logit-normal (sigmoid of a normal, SD3) and
optionally shifted, t -> s t / (1 + (s - 1) t), which spends more of training (and of sampling, with
the same map) at high noise; SD3 and Wan shift by the resolution (Wan2.1: 3 at 480p, 5 at 720p).

The clean estimate is what the samplers take (`Objective.denoise`); they live in
`vidforge.diffusion.flow_samplers`, by name in `vidforge.sampler_registry`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch

from vidforge.diffusion.objective import Objective

CLEAN_LOSS_MIN_T = 0.05  # x-prediction's velocity loss divides by t, at least this (Li & He 2025)


def shift_time(t: torch.Tensor, shift: float) -> torch.Tensor:
    """t -> s t / (1 + (s - 1) t): SD3's and Wan's timestep shift (s = 1 leaves t as it is)."""
    return shift * t / (1 + (shift - 1) * t)


def token_shift(rule: tuple[int, float, int, float], tokens: int) -> float:
    """The shift e^mu for a sample of `tokens` tokens, mu linear through (n0, mu0) and (n1, mu1) (`rule`):
    FLUX's and LTX-2's dynamic shifting, computed as diffusers' calculate_shift does; the exponential
    time shift e^mu / (e^mu + 1/t - 1) is `shift_time` by e^mu."""
    n0, mu0, n1, mu1 = rule
    slope = (mu1 - mu0) / (n1 - n0)
    return math.exp(tokens * slope + (mu0 - slope * n0))


def unshift_time(t: torch.Tensor, shift: float) -> torch.Tensor:
    """The inverse of `shift_time`: t -> t / (s - (s - 1) t)."""
    return t / (shift - (shift - 1) * t)


@dataclass(frozen=True)
class RectifiedFlow(Objective):
    """The objective's math (see `vidforge.diffusion.objective`); the level is the flow time t.

    `sampling`: `uniform` t ~ U(0, 1), or `logit-normal` t = sigmoid(N(logit_mean, logit_std^2)); then
    shifted by `shift`. The network's noise-level input is t itself: vidforge's DiT scales it by 1000
    in its sinusoids, and so does the wan family (Wan's timestep 1000 t).

    `prediction`: the network outputs the velocity noise - x0 (`velocity`), or x0 itself (`clean`,
    Li & He 2025's x-prediction) trained, as they found best, on the velocity error that estimate
    implies: v - v_hat = (x0_hat - x0) / t, with t floored at CLEAN_LOSS_MIN_T (their clip) so that the
    weight stays bounded near clean data. Sampling is the same either way: the samplers take the clean
    estimate."""

    level_name = "t"
    level_bucket_edges = (0.2, 0.4, 0.6, 0.8)

    sampling: Literal["uniform", "logit-normal"] = "logit-normal"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0
    prediction: Literal["velocity", "clean"] = "velocity"
    shift_tokens: tuple[int, float, int, float] | None = None
    """`shift` by the sample's token count (`token_shift`'s rule; `at_tokens`); None: `shift` always."""
    t_range: tuple[float, float] = (0.0, 1.0)
    """The training times' range [low, high) (high 1: [low, 1]): the distribution above restricted to it,
    e.g. one expert's side of a two-expert model's boundary (`vidforge.train.experts`)."""

    def __post_init__(self) -> None:
        if self.sampling not in ("uniform", "logit-normal"):
            raise ValueError(f"flow timestep sampling: use uniform or logit-normal, got {self.sampling!r}")
        if self.prediction not in ("velocity", "clean"):
            raise ValueError(f"flow prediction: use velocity or clean, got {self.prediction!r}")
        if not 0 <= self.t_range[0] < self.t_range[1] <= 1:
            raise ValueError(f"flow t_range: need 0 <= low < high <= 1, got {self.t_range}")
        if self.logit_std <= 0 or self.shift <= 0:
            raise ValueError(f"flow logit_std and shift must be > 0, got {self.logit_std} and {self.shift}")

    def at_tokens(self, tokens: int) -> RectifiedFlow:
        """This objective for samples of `tokens` tokens: its shift the token rule's, if it has one."""
        if self.shift_tokens is None:
            return self
        return replace(self, shift=token_shift(self.shift_tokens, tokens))

    def sample_levels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training times (n,) in (0, 1), float32 on the CPU: one draw of n numbers either way."""
        if self.t_range != (0.0, 1.0):
            return self._sample_in_range(n, generator)
        if self.sampling == "uniform":
            t = torch.rand(n, generator=generator)
        else:
            t = torch.sigmoid(self.logit_mean + self.logit_std * torch.randn(n, generator=generator))
        return shift_time(t, self.shift)

    def _sample_in_range(self, n: int, generator: torch.Generator | None) -> torch.Tensor:
        """Times drawn from the distribution restricted to `t_range`, in closed form (one uniform draw):
        the shift is increasing, so the range maps back to one of unshifted t, then, for logit-normal, to
        one of the normal's CDF, whose inverse takes a uniform draw over it to the restricted normal."""
        low, high = (unshift_time(torch.tensor(v, dtype=torch.float64), self.shift) for v in self.t_range)
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        if self.sampling == "uniform":
            t = low + (high - low) * u
        else:
            a, b = (
                torch.special.ndtr((torch.logit(v) - self.logit_mean) / self.logit_std) for v in (low, high)
            )
            t = torch.sigmoid(self.logit_mean + self.logit_std * torch.special.ndtri(a + (b - a) * u))
        t = shift_time(t, self.shift).float()
        # rounding (float64 -> float32) must not carry a time across the range's ends
        lo, hi = (torch.tensor(v, dtype=torch.float32) for v in self.t_range)
        below_high = torch.nextafter(hi, lo) if self.t_range[1] < 1 else hi
        return t.clamp(min=float(lo), max=float(below_high))

    def corrupt(self, clean: torch.Tensor, noise: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """x_t = (1 - t) x0 + t noise."""
        return (1 - level_b) * clean + level_b * noise

    def implied_noise(self, noisy: torch.Tensor, clean: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """noise = (x_t - (1 - t) x0) / t."""
        return (noisy - (1 - level_b) * clean) / level_b

    def network_input(self, noisy: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        return noisy

    def network_level(self, level: torch.Tensor) -> torch.Tensor:
        return level

    def target(self, clean: torch.Tensor, noise: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """The velocity noise - x0, or x0."""
        return noise - clean if self.prediction == "velocity" else clean

    def error_scale(self, level_b: torch.Tensor) -> torch.Tensor | None:
        """x-prediction: 1 / t (floored), the clean estimate's error as a velocity error."""
        return 1 / level_b.clamp(min=CLEAN_LOSS_MIN_T) if self.prediction == "clean" else None

    def denoised(self, noisy: torch.Tensor, raw: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """x0 = x_t - t v, or the output itself."""
        if self.prediction == "clean":
            return raw.to(noisy.dtype)
        return noisy - level_b * raw.to(noisy.dtype)
