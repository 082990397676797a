"""Rectified flow (Liu et al. 2022; Esser et al. 2024, SD3; Wan2.1), the second `Objective` beside EDM.

Training: x_t = (1 - t) x0 + t noise for t in [0, 1], and the network predicts the velocity
v = noise - x0 (diffusers' "flow_prediction") from x_t itself, with an unweighted squared error; the
clean estimate is x0 = x_t - t v. t is drawn uniform or logit-normal (sigmoid of a normal, SD3) and
optionally shifted, t -> s t / (1 + (s - 1) t), which spends more of training (and of sampling, with
the same map) at high noise; SD3 and Wan shift by the resolution (Wan2.1: 3 at 480p, 5 at 720p).

Sampling integrates dx/dt = v = (x - D(x, t)) / t from pure noise at t = 1 down to t = 0. The samplers
take the objective's denoiser D(x, t) (`Objective.denoise`, the clean estimate; t a 0-d tensor: where
the network is evaluated), as the EDM samplers do, and know nothing of models, so they are tested
against diffusers' schedulers on a closed-form field:
- `flow_euler_sampler`: x_{i+1} = x_i + (t_{i+1} - t_i) v(x_i, t_i) (FlowMatchEulerDiscreteScheduler).
- `unipc_sampler`: UniPC (Zhao et al. 2023) as diffusers' UniPCMultistepScheduler runs it for Wan
  (flow_prediction, predict_x0, bh2, lower order on the last steps, the corrector after every step
  but the first): in lambda = ln((1 - t) / t) the flow ODE is linear in x with the clean estimate as
  forcing; each step integrates the linear part exactly and a polynomial through the last `order`
  estimates (predictor), then corrects with the estimate at the new point.
Wan's pipeline evaluates the network at integer timesteps floor(1000 t); `unipc_sampler` does the same
(`wan_times`), so a Wan model sees what it was trained and released with.

Guidance and negative prompts are the denoiser's business: `vidforge.diffusion.guidance.
classifier_free_guidance` mixes clean estimates, which for a flow is mixing velocities (x0 = x - t v is
affine in v at a given x), and the unconditional rows may carry a negative prompt's text instead of a
dropped caption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from vidforge.diffusion.objective import Objective
from vidforge.diffusion.samplers import Denoiser

TRAIN_TIMESTEPS = 1000  # Wan's and SD3's timestep = 1000 t
CLEAN_LOSS_MIN_T = 0.05  # x-prediction's velocity loss divides by t, at least this (Li & He 2025)


def shift_time(t: torch.Tensor, shift: float) -> torch.Tensor:
    """t -> s t / (1 + (s - 1) t): SD3's and Wan's timestep shift (s = 1 leaves t as it is)."""
    return shift * t / (1 + (shift - 1) * t)


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

    def __post_init__(self) -> None:
        if self.sampling not in ("uniform", "logit-normal"):
            raise ValueError(f"flow timestep sampling: use uniform or logit-normal, got {self.sampling!r}")
        if self.prediction not in ("velocity", "clean"):
            raise ValueError(f"flow prediction: use velocity or clean, got {self.prediction!r}")
        if self.logit_std <= 0 or self.shift <= 0:
            raise ValueError(f"flow logit_std and shift must be > 0, got {self.logit_std} and {self.shift}")

    def sample_levels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training times (n,) in (0, 1), float32 on the CPU: one draw of n numbers either way."""
        if self.sampling == "uniform":
            t = torch.rand(n, generator=generator)
        else:
            t = torch.sigmoid(self.logit_mean + self.logit_std * torch.randn(n, generator=generator))
        return shift_time(t, self.shift)

    def corrupt(self, clean: torch.Tensor, noise: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """x_t = (1 - t) x0 + t noise."""
        return (1 - level_b) * clean + level_b * noise

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


# --- sampling schedules -------------------------------------------------------------------------------


def flow_sigmas(steps: int, shift: float = 1.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(steps + 1,) decreasing times: `steps` evenly spaced from 1 down to 1/1000 (Wan's grid of 1000
    training timesteps), shifted, then 0 (diffusers' UniPC with use_flow_sigmas, and
    FlowMatchEulerDiscreteScheduler given these unshifted sigmas)."""
    if steps < 1:
        raise ValueError(f"sampling steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"flow shift must be > 0, got {shift}")
    ramp = torch.linspace(1, 1 / TRAIN_TIMESTEPS, steps + 1, dtype=torch.float64)[:-1]
    return torch.cat([shift_time(ramp, shift), ramp.new_zeros(1)]).to(dtype)


START_NUDGE = 1e-6  # UniPC starts just below t = 1, where lambda = ln((1 - t) / t) is finite


def _below_one(levels: list[float]) -> list[float]:
    """A first time of 1 moved to 1 - 1e-6, as diffusers' UniPC does."""
    return [levels[0] - START_NUDGE, *levels[1:]] if abs(levels[0] - 1) < START_NUDGE else levels


def wan_times(sigmas: torch.Tensor) -> torch.Tensor:
    """The times Wan's pipeline evaluates the network at: its integer timesteps floor(1000 t) / 1000
    (diffusers' UniPC casts 1000 t to int64, after moving a first t of 1 just below it), one per step
    (the final 0 dropped)."""
    levels = torch.tensor(_below_one([float(s) for s in sigmas[:-1]]), dtype=torch.float64)
    return torch.floor(levels * TRAIN_TIMESTEPS) / TRAIN_TIMESTEPS


def _levels(sigmas: torch.Tensor) -> list[float]:
    levels = [float(s) for s in sigmas]
    if (
        len(levels) < 2
        or levels[-1] != 0
        or levels[0] > 1
        or any(a <= b for a, b in zip(levels, levels[1:], strict=False))
    ):
        raise ValueError("flow sigmas must decrease strictly from <= 1 and end at 0 (see flow_sigmas)")
    return levels


def _velocity(denoise: Denoiser, x: torch.Tensor, t: float) -> torch.Tensor:
    """The network's velocity at x, evaluated at time t: v = (x - D(x, t)) / t."""
    if t <= 0:
        raise ValueError(
            "flow sampling evaluates the network at t = 0 (Wan's timestep floor(1000 t) is 0 below "
            "t = 0.001); use fewer steps or a larger shift"
        )
    return (x - denoise(x, torch.tensor(t, dtype=x.dtype, device=x.device))) / t


# --- samplers -------------------------------------------------------------------------------------------


def flow_euler_sampler(
    denoise: Denoiser, noise: torch.Tensor, sigmas: torch.Tensor, times: torch.Tensor | None = None
) -> torch.Tensor:
    """Euler on the flow ODE from `noise` (x at t = sigmas[0], pure noise for sigmas[0] = 1) to t = 0.
    `times`: where to evaluate the network at each step (default: the sigmas themselves)."""
    levels = _levels(sigmas)
    evals = levels[:-1] if times is None else [float(t) for t in times]
    x = noise
    for i in range(len(levels) - 1):
        x = x + (levels[i + 1] - levels[i]) * _velocity(denoise, x, evals[i])
    return x


def _lambda(sigma: float) -> float:
    """ln(alpha / sigma) with alpha = 1 - sigma: the half log-SNR of the flow path."""
    return math.log(1 - sigma) - math.log(sigma)


def _unipc_coefficients(hh: float, rks: list[float], order: int) -> tuple[list[list[float]], list[float]]:
    """UniPC's Vandermonde system R (order x order, rows rks^(k-1)) and right side b for B(h) = e^hh - 1
    (bh2), hh = -h."""
    h_phi_k = math.expm1(hh) / hh - 1
    b_h = math.expm1(hh)
    factorial = 1
    rows, rhs = [], []
    for k in range(1, order + 1):
        rows.append([r ** (k - 1) for r in rks])
        rhs.append(h_phi_k * factorial / b_h)
        factorial *= k + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    return rows, rhs


def _solve(rows: list[list[float]], rhs: list[float]) -> list[float]:
    return torch.linalg.solve(
        torch.tensor(rows, dtype=torch.float64), torch.tensor(rhs, dtype=torch.float64)
    ).tolist()


def _unipc_update(
    x: torch.Tensor,
    estimates: list[torch.Tensor],
    lambdas: list[float],
    sigma_from: float,
    sigma_to: float,
    order: int,
    corrector_estimate: torch.Tensor | None = None,
) -> torch.Tensor:
    """One UniPC update of x from sigma_from to sigma_to. `estimates`/`lambdas`: the clean estimates
    and half log-SNRs of the previous points, the one at sigma_from last. Predictor (UniP) without
    `corrector_estimate`; corrector (UniC) with the estimate at sigma_to."""
    m0 = estimates[-1]
    if sigma_to == 0:  # the limit h -> inf of the update: the clean estimate itself
        return m0
    lambda_s0, lambda_t = lambdas[-1], _lambda(sigma_to)
    h = lambda_t - lambda_s0
    rks, differences = [], []
    for k in range(1, order):
        rk = (lambdas[-(k + 1)] - lambda_s0) / h
        rks.append(rk)
        differences.append((estimates[-(k + 1)] - m0) / rk)
    rks.append(1.0)
    hh = -h
    alpha_t = 1 - sigma_to
    b_h = math.expm1(hh)  # bh2's B(h), which is also h phi_1(h) = e^hh - 1
    x_next = (sigma_to / sigma_from) * x - alpha_t * b_h * m0
    rows, rhs = _unipc_coefficients(hh, rks, order)
    if corrector_estimate is None:
        if not differences:
            return x_next
        rhos = [0.5] if order == 2 else _solve([r[:-1] for r in rows[:-1]], rhs[:-1])
        residual = sum(rho * d for rho, d in zip(rhos, differences, strict=True))
        return x_next - alpha_t * b_h * residual
    rhos = [0.5] if order == 1 else _solve(rows, rhs)
    residual = sum((rho * d for rho, d in zip(rhos[:-1], differences, strict=True)), torch.zeros_like(x))
    return x_next - alpha_t * b_h * (residual + rhos[-1] * (corrector_estimate - m0))


def unipc_sampler(
    denoise: Denoiser,
    noise: torch.Tensor,
    sigmas: torch.Tensor,
    times: torch.Tensor | None = None,
    order: int = 2,
) -> torch.Tensor:
    """UniPC-bh2 multistep with the corrector, as diffusers' UniPCMultistepScheduler runs Wan2.1 (see
    the module docstring). `sigmas` from `flow_sigmas` (a first sigma of 1 is moved to 1 - 1e-6, where
    lambda is finite, as diffusers does); `times`: where the network is evaluated (default
    `wan_times(sigmas)`). The order ramps up from 1 over the first steps and down to 1 on the last
    (lower_order_final). One network evaluation per step."""
    if order < 1:
        raise ValueError(f"UniPC order must be >= 1, got {order}")
    levels = _below_one(_levels(sigmas))
    evals = [float(t) for t in (wan_times(sigmas) if times is None else times)]
    steps = len(levels) - 1
    x = noise
    estimates: list[torch.Tensor] = []
    lambdas: list[float] = []
    last_x: torch.Tensor | None = None
    last_order = 1
    for i in range(steps):
        # As diffusers: the velocity from the network at Wan's integer timestep, the clean estimate
        # x - t v with the schedule's own t (equal to D(x, t) when the two times agree).
        estimate = x - levels[i] * _velocity(denoise, x, evals[i])
        if last_x is not None:
            x = _unipc_update(last_x, estimates, lambdas, levels[i - 1], levels[i], last_order, estimate)
        estimates = [*estimates, estimate][-order:]
        lambdas = [*lambdas, _lambda(levels[i])][-order:]
        last_order = min(order, steps - i, len(estimates))
        last_x = x
        x = _unipc_update(x, estimates, lambdas, levels[i], levels[i + 1], last_order)
    return x


def flow_sample(
    denoise: Denoiser,
    noise: torch.Tensor,
    sampler: Literal["euler", "unipc"],
    steps: int,
    shift: float = 1.0,
) -> torch.Tensor:
    """Run a flow sampler over `flow_sigmas(steps, shift)`: `unipc` (Wan's default, evaluated at Wan's
    integer timesteps) or `euler`."""
    sigmas = flow_sigmas(steps, shift)
    if sampler == "unipc":
        return unipc_sampler(denoise, noise, sigmas)
    if sampler == "euler":
        return flow_euler_sampler(denoise, noise, sigmas)
    raise ValueError(f"flow sampler: unknown {sampler!r}; use unipc or euler")
