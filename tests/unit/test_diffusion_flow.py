"""Rectified flow: the objective against diffusers' flow-matching noising and closed-form training
distributions; flow-Euler and UniPC step by step against diffusers' FlowMatchEulerDiscreteScheduler and
UniPCMultistepScheduler (flow prediction, shift, guidance with a negative prompt) on the closed-form
velocity field of Gaussian data, and both against the exact solution of that flow."""

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

from vidforge.diffusion.flow import RectifiedFlow, shift_time
from vidforge.diffusion.flow_samplers import flow_euler_sampler, flow_sigmas, unipc_sampler, wan_times
from vidforge.diffusion.from_profile import sample
from vidforge.diffusion.guidance import classifier_free_guidance
from vidforge.profile.diffusion import Diffusion


def flow_sample(denoise, noise, sampler: str, steps: int, shift: float) -> torch.Tensor:
    """The profile's way in: the registry's sampler over flow_sigmas(steps, shift)."""
    settings = Diffusion(objective="flow", sampler=sampler, steps=steps, flow_shift=shift)
    return sample(denoise, noise, settings)


STD = 0.5  # data ~ N(mean_c, STD^2 I), a mean per condition
SHAPE = (2, 3, 2, 4, 4)


def gaussian_velocity(x: torch.Tensor, t: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """E[noise - x0 | x_t = x] for x_t = (1 - t) x0 + t noise, x0 ~ N(mean, STD^2), noise ~ N(0, 1)."""
    t = t.to(x.dtype)
    var = (1 - t) ** 2 * STD**2 + t**2
    centred = x - (1 - t) * mean
    return t * centred / var - (mean + (1 - t) * STD**2 * centred / var)


def _means():
    g = torch.Generator().manual_seed(0)
    return torch.randn(SHAPE, generator=g, dtype=torch.float64), torch.randn(
        SHAPE, generator=g, dtype=torch.float64
    )


def guided_field(scale: float):
    """The guided denoiser the samplers take (classifier-free guidance over the flow objective's clean
    estimates, the unconditional rows following a negative prompt: another mean) and the guided
    velocity the reference loop hands diffusers' schedulers."""
    positive, negative = _means()
    flow = RectifiedFlow()

    def batched(x, t, uncond):
        copies = x.shape[0] // positive.shape[0]
        rows = uncond[:, None, None, None, None]
        mean = torch.where(rows, negative.repeat(copies, 1, 1, 1, 1), positive.repeat(copies, 1, 1, 1, 1))

        def network(x_in, level):
            return gaussian_velocity(x_in, level[0], mean)

        return flow.denoise(network, x, t.reshape(()).expand(x.shape[0]))

    def reference(x, t):
        v_cond, v_uncond = gaussian_velocity(x, t, positive), gaussian_velocity(x, t, negative)
        return v_uncond + scale * (v_cond - v_uncond)

    return classifier_free_guidance(batched, scale), reference


def _recording(denoise):
    states = []

    def record(x, t):
        states.append((x.clone(), float(t)))
        return denoise(x, t)

    return record, states


def _noise():
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_noising_and_target_are_diffusers_flow_matching():
    flow = RectifiedFlow()
    g = torch.Generator().manual_seed(2)
    clean, noise = torch.randn(2, 4, 3, generator=g), torch.randn(2, 4, 3, generator=g)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    index = torch.tensor([100, 700])
    t = scheduler.sigmas[index]
    t_b = flow.expand(t, clean)
    noised = flow.corrupt(clean, noise, t_b)
    torch.testing.assert_close(noised, scheduler.scale_noise(clean, scheduler.timesteps[index], noise))
    assert flow.network_input(noised, t_b) is noised and flow.network_level(t) is t
    velocity = flow.target(clean, noise, t_b)
    torch.testing.assert_close(velocity, noise - clean)
    torch.testing.assert_close(flow.denoised(noised, velocity, t_b), clean)


def test_clean_prediction_is_trained_on_the_velocity_error_it_implies():
    """x-prediction (Li & He 2025): the network outputs x0; the loss's error times its weight is the
    error of the velocity that estimate implies, (x_t - x0_hat) / t - (noise - x0), down to t = 0.05,
    where the weight stops growing."""
    flow = RectifiedFlow(prediction="clean")
    g = torch.Generator().manual_seed(4)
    clean, noise, estimate = (torch.randn(3, 4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    t_b = flow.expand(torch.tensor([0.9, 0.3, 0.01], dtype=torch.float64), clean)
    noisy = flow.corrupt(clean, noise, t_b)
    error = flow.error_scale(t_b) * (estimate - flow.target(clean, noise, t_b))
    implied = (noisy - estimate) / t_b - (noise - clean)
    torch.testing.assert_close(error[:2], -implied[:2])
    torch.testing.assert_close(error[2], (estimate - clean)[2] / 0.05)
    torch.testing.assert_close(flow.denoised(noisy, estimate, t_b), estimate)
    assert RectifiedFlow().error_scale(t_b) is None


def test_clean_and_velocity_prediction_sample_the_same_flow():
    """The exact networks of both parameterisations (for Gaussian data) give the same clean estimates,
    so the samplers, which take clean estimates, run the same flow: to mean + STD noise at the end."""
    mean, _ = _means()
    noise = _noise()
    outs = []
    for prediction in ("velocity", "clean"):
        flow = RectifiedFlow(prediction=prediction)

        def network(x, level, flow=flow):
            velocity = gaussian_velocity(x, level[0], mean)
            return velocity if flow.prediction == "velocity" else x - level[0] * velocity

        def denoise(x, t, flow=flow, network=network):
            return flow.denoise(network, x, t.reshape(()).expand(x.shape[0]))

        outs.append(flow_sample(denoise, noise, "unipc", 30, shift=3.0))
    torch.testing.assert_close(outs[0], outs[1])
    assert (outs[1] - (mean + STD * noise)).abs().max() < 5e-3


@pytest.mark.parametrize(
    "sampling,shift", [("uniform", 1.0), ("uniform", 3.0), ("logit-normal", 1.0), ("logit-normal", 5.0)]
)
def test_training_times_follow_their_closed_form_distribution(sampling, shift):
    flow = RectifiedFlow(sampling=sampling, logit_mean=0.3, logit_std=0.8, shift=shift)
    t = flow.sample_levels(40_000, torch.Generator().manual_seed(3)).double().sort().values
    grid = torch.linspace(0.02, 0.98, 49, dtype=torch.float64)
    unshifted = grid / (shift - (shift - 1) * grid)  # the inverse of shift_time
    torch.testing.assert_close(shift_time(unshifted, shift), grid)
    if sampling == "uniform":
        cdf = unshifted
    else:
        z = (torch.log(unshifted / (1 - unshifted)) - 0.3) / 0.8
        cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
    empirical = torch.searchsorted(t, grid).double() / t.numel()
    assert (empirical - cdf).abs().max() < 0.01


@pytest.mark.parametrize("shift,scale", [(1.0, 1.0), (3.0, 5.0)])
def test_flow_euler_equals_flow_match_euler_step_by_step(shift, scale):
    steps = 12
    velocity, reference = guided_field(scale)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    unshifted = torch.linspace(1, 1 / 1000, steps + 1, dtype=torch.float64)[:-1]
    scheduler.set_timesteps(sigmas=unshifted.tolist())
    sigmas = flow_sigmas(steps, shift)
    torch.testing.assert_close(sigmas, scheduler.sigmas.double(), rtol=1e-6, atol=1e-6)

    record, ours = _recording(velocity)
    final = flow_euler_sampler(record, _noise(), sigmas)
    x = _noise()
    for i, timestep in enumerate(scheduler.timesteps):
        torch.testing.assert_close(ours[i][0], x, rtol=1e-5, atol=1e-5)
        x = scheduler.step(reference(x, timestep / 1000), timestep, x).prev_sample
    torch.testing.assert_close(final, x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order,shift,scale", [(2, 3.0, 5.0), (2, 5.0, 1.0), (3, 3.0, 4.0)])
def test_unipc_equals_diffusers_unipc_step_by_step(order, shift, scale):
    """Wan2.1's scheduler config: flow prediction, flow sigmas with flow_shift, bh2, lower order final."""
    steps = 10
    velocity, reference = guided_field(scale)
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift, solver_order=order
    )
    scheduler.set_timesteps(steps)
    sigmas = flow_sigmas(steps, shift)
    assert (wan_times(sigmas) * 1000).round().long().tolist() == scheduler.timesteps.tolist()

    record, ours = _recording(velocity)
    final = unipc_sampler(record, _noise(), sigmas, order=order)
    x = _noise()
    for i, timestep in enumerate(scheduler.timesteps):
        torch.testing.assert_close(ours[i][0], x, rtol=1e-5, atol=1e-5)
        assert ours[i][1] == pytest.approx(int(timestep) / 1000)
        x = scheduler.step(reference(x, timestep / 1000), timestep, x).prev_sample
    torch.testing.assert_close(final, x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sampler,steps,tolerance", [("unipc", 30, 5e-3), ("flow-euler", 200, 3e-2)])
def test_samplers_reach_the_exact_end_of_the_gaussian_flow(sampler, steps, tolerance):
    """For Gaussian data the flow carries noise n at t = 1 to mean + STD n at t = 0. The schedule's
    last time is about 1/steps (shifted), where both samplers jump to the clean estimate, so neither
    is exact; measured: UniPC 2.1e-3 at 30 steps, Euler 0.17 at 30 and 2.7e-2 at 200."""
    mean, _ = _means()
    noise = _noise()
    out = flow_sample(lambda x, t: x - t * gaussian_velocity(x, t, mean), noise, sampler, steps, shift=3.0)
    assert (out - (mean + STD * noise)).abs().max() < tolerance


def test_unipc_refuses_a_schedule_that_reaches_timestep_0_before_calling_the_network():
    """A shift below 1 over many steps puts the last times below Wan's first integer timestep: refused
    before the first step, not after all but the last."""
    calls = []

    def denoise(x, t):
        calls.append(float(t))
        return x

    with pytest.raises(ValueError, match="would evaluate the network at t = 0"):
        flow_sample(denoise, _noise(), "unipc", 3000, shift=0.3)
    assert calls == []
