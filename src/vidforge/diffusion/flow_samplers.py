"""Samplers of the rectified-flow objective (`vidforge.diffusion.flow`), listed by name in
`vidforge.sampler_registry`.

They integrate dx/dt = v = (x - D(x, t)) / t from pure noise at t = 1 down to t = 0, taking the
objective's denoiser D(x, t) (`Objective.denoise`, the clean estimate; t a 0-d tensor: where the network
is evaluated), as the EDM samplers do, and know nothing of models, so they are tested against diffusers'
schedulers on a closed-form field:
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

import torch

from vidforge.diffusion.flow import shift_time
from vidforge.diffusion.objective import Denoiser

TRAIN_TIMESTEPS = 1000  # Wan's and SD3's timestep = 1000 t


def flow_sigmas(
    steps: int,
    shift: float = 1.0,
    dtype: torch.dtype = torch.float64,
    end: float = 1 / TRAIN_TIMESTEPS,
    terminal: float | None = None,
) -> torch.Tensor:
    """(steps + 1,) decreasing times: `steps` of `steps + 1` evenly spaced from 1 down to `end` (the last
    dropped), shifted, then 0. `end` 1/1000, Wan's grid of 1000 training timesteps: diffusers' UniPC with
    use_flow_sigmas, and FlowMatchEulerDiscreteScheduler given these unshifted sigmas; `end` 0: the
    linspace(1, 0, steps + 1) HunyuanVideo-1.5's and LTX-2's pipelines hand their scheduler. `terminal`:
    the shifted times stretched so the last is `terminal` (1 - t scaled, the scheduler's shift_terminal)."""
    if steps < 1:
        raise ValueError(f"sampling steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"flow shift must be > 0, got {shift}")
    ramp = torch.linspace(1, end, steps + 1, dtype=torch.float64)[:-1]
    shifted = shift_time(ramp, shift)
    if terminal is not None:
        shifted = 1 - (1 - shifted) / ((1 - shifted[-1]) / (1 - terminal))
    return torch.cat([shifted, ramp.new_zeros(1)]).to(dtype)


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


def _evaluation_times(times: torch.Tensor | list[float]) -> list[float]:
    """Where the network is evaluated, one time per step, all > 0 (the velocity divides by t): checked
    before the first step rather than found at the last."""
    evals = [float(t) for t in times]
    if min(evals) <= 0:
        raise ValueError(
            "flow sampling would evaluate the network at t = 0 (Wan's timestep floor(1000 t) is 0 below "
            "t = 0.001); use fewer steps or a larger shift"
        )
    return evals


def _velocity(denoise: Denoiser, x: torch.Tensor, t: float) -> torch.Tensor:
    """The network's velocity at x, evaluated at time t: v = (x - D(x, t)) / t."""
    return (x - denoise(x, torch.tensor(t, dtype=x.dtype, device=x.device))) / t


# --- samplers -------------------------------------------------------------------------------------------


def flow_euler_sampler(
    denoise: Denoiser, noise: torch.Tensor, sigmas: torch.Tensor, times: torch.Tensor | None = None
) -> torch.Tensor:
    """Euler on the flow ODE from `noise` (x at t = sigmas[0], pure noise for sigmas[0] = 1) to t = 0.
    `times`: where to evaluate the network at each step (default: the sigmas themselves)."""
    levels = _levels(sigmas)
    evals = _evaluation_times(levels[:-1] if times is None else times)
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
    evals = _evaluation_times(wan_times(sigmas) if times is None else times)
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
