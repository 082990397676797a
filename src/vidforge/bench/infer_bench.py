"""`vidforge bench infer`: sampling latency per sampler step and end to end, with classifier-free guidance
batched (conditional and unconditional rows in one doubled batch, what `vidforge infer` does) and
sequential (two model calls of the plain batch per evaluation), for each sampler of the profile's
objective (`vidforge.sampler_registry.samplers_of`), or those asked for.

The model is the profile's DiT with random weights (latency does not depend on the weights), run the way
`vidforge.sampling.latents` runs it (its own denoiser): the objective's preconditioning, the learned null caption as the unconditional
branch, the sampler's own schedule (Karras sigmas, or shifted flow times). Latents of `bench.latent_*`, `infer.batch_size` prompts; the
tokenizer's decode is not included (a separate stage)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from vidforge import sampler_registry
from vidforge.bench.timing import time_calls
from vidforge.diffusion import classifier_free_guidance, sample
from vidforge.diffusion.guidance import BatchedDenoiser
from vidforge.diffusion.objective import Denoiser
from vidforge.errors import UserInputError
from vidforge.estimate.workload import Workload
from vidforge.models import build_model
from vidforge.parallel.parallelize import compute_dtype
from vidforge.parallel.runtime import init_runtime
from vidforge.profile import RunProfile
from vidforge.sampling.latents import batched_denoiser

GUIDANCE_MODES = ("batched", "sequential")


def sequential_guidance(batched: BatchedDenoiser, scale: float) -> Denoiser:
    """Classifier-free guidance without batching: the conditional and the unconditional branch as two
    model calls of the plain batch (less memory, usually slower than one doubled batch)."""

    def denoise(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        cond = batched(x, sigma, torch.zeros(b, dtype=torch.bool, device=x.device))
        if scale == 1.0:
            return cond
        uncond = batched(x, sigma, torch.ones(b, dtype=torch.bool, device=x.device))
        return uncond + scale * (cond - uncond)

    return denoise


@dataclass
class InferRow:
    sampler: str
    guidance: str
    steps: int
    model_calls: int
    rows_per_call: int
    end_to_end_s: float
    per_step_s: float
    per_model_call_s: float
    spread: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def chosen(asked: Sequence[str] | None, offered: Sequence[str], what: str, field: str) -> tuple[str, ...]:
    """`asked` (every one of `offered` when None), refused in one line where one is not offered."""
    if not asked:
        return tuple(offered)
    wrong = [a for a in asked if a not in offered]
    if wrong:
        raise UserInputError(f"{field}: {', '.join(wrong)} {what}; use some of {', '.join(offered)}")
    return tuple(dict.fromkeys(asked))


def run(
    profile: RunProfile, samplers: Sequence[str] | None = None, guidance: Sequence[str] | None = None
) -> dict[str, Any]:
    """Time `samplers` (default: every sampler of the profile's objective) under `guidance` modes
    (default: batched and sequential)."""
    objective = profile.diffusion.objective
    samplers = chosen(
        samplers,
        sampler_registry.samplers_of(objective),
        f"do not sample the {objective} objective",
        "--sampler",
    )
    guidance = chosen(guidance, GUIDANCE_MODES, "is not a guidance mode", "--guidance")
    device = init_runtime(profile).device
    dtype = compute_dtype(profile) if device.type == "cuda" else torch.float32
    workload = Workload.from_profile(profile, samples=profile.infer.batch_size, packed=False)
    torch.manual_seed(profile.train.seed)
    model = build_model(profile.model, device=device, dtype=dtype).eval()
    b = workload.samples
    g = torch.Generator().manual_seed(0)
    text = torch.randn((b, workload.text_tokens, profile.model.text_dim), generator=g).to(device, dtype)
    mask = torch.ones(b, workload.text_tokens, dtype=torch.bool, device=device)
    noise = torch.randn((b, *workload.latent), generator=g).to(device)
    calls: list[int] = []

    def network(x, noise_level, texts, masks, drop_text):
        calls.append(x.shape[0])
        return model(x, noise_level, texts, masks, drop_text=drop_text)

    batched = batched_denoiser(network, profile, text, mask, dtype=dtype)  # `vidforge infer`'s own

    scale = profile.diffusion.guidance
    makers = {"batched": classifier_free_guidance, "sequential": sequential_guidance}
    modes = {name: makers[name] for name in guidance} if scale != 1.0 else {}
    if not modes:
        modes = {"none (guidance 1)": classifier_free_guidance}
    rows = []
    for sampler in samplers:
        diffusion = profile.diffusion.model_copy(update={"sampler": sampler, "churn": 0.0})
        for name, make in modes.items():
            denoiser = make(batched, scale)

            @torch.no_grad()
            def once(denoiser: Denoiser = denoiser, diffusion=diffusion) -> None:
                sample(denoiser, noise, diffusion)

            calls.clear()
            once()
            per_sample_calls, rows_per_call = len(calls), max(calls)
            timing = time_calls(once, max(0, profile.bench.warmup - 1), profile.bench.repeats, device)
            rows.append(
                InferRow(
                    sampler=sampler,
                    guidance=name,
                    steps=diffusion.steps,
                    model_calls=per_sample_calls,
                    rows_per_call=rows_per_call,
                    end_to_end_s=timing.median,
                    per_step_s=timing.median / diffusion.steps,
                    per_model_call_s=timing.median / per_sample_calls,
                    spread=timing.spread,
                )
            )
    return {
        "profile": profile.name,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "workload": workload.describe(),
        "guidance_scale": scale,
        "objective": objective,
        "samplers": list(samplers),
        "rows": [r.as_dict() for r in rows],
    }
