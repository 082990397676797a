"""`vidforge bench infer --nproc N`: sampling on N ranks against one process, measured in the same run.

Every rank builds the profile's model with the same random weights (latency does not depend on them;
perturbed away from adaLN-Zero's identity blocks, so that the difference below compares real outputs).
The one-process reference is rank 0 sampling alone (`vidforge infer`'s single-process sampler) while
the others wait at a barrier; then the N ranks sample with the plan `vidforge infer --nproc N` would take
(`InferPlan`: infer.tp, CFG-parallel, the sequence split with parallel.cp_impl), built by the same
`parallel_sampler`. The two alternate, round by round: bench.warmup rounds untimed, then the median of
bench.repeats rounds of each.
Reported: latency per sampler step and end to end, speed-up (one process / N ranks) and efficiency
(speed-up / N), and how far the N ranks' latents are from the one process's (a check that the split
computes the same thing). Latents of bench.latent_*, infer.batch_size prompts with bench.text_tokens
random caption tokens; the tokenizer's decode and the text encoder are not included; churn is off (with
churn the ranks draw other noise)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from vidforge.bench.timing import Stopwatch, Timing
from vidforge.estimate.workload import Workload
from vidforge.infer.plan import InferPlan, Sampler, check_plan, parallel_sampler, profile_slicing
from vidforge.models import build_model
from vidforge.parallel.parallelize import compute_dtype
from vidforge.parallel.runtime import init_runtime
from vidforge.profile import RunProfile
from vidforge.sampling.latents import sample_latents


@dataclass
class ScalingRow:
    layout: str
    ranks: int
    end_to_end_s: float
    per_step_s: float
    spread: float
    speedup: float
    efficiency: float


def run(profile: RunProfile) -> dict[str, Any]:
    """Measure on this rank's part of the run (every rank calls it); the result is complete on rank 0."""
    runtime = init_runtime(profile)
    device, world = runtime.device, runtime.world
    if world < 2:
        from vidforge.errors import UserInputError

        raise UserInputError("bench infer --nproc: give 2 or more ranks (--nproc 1 is `bench infer` itself)")
    prof = profile.model_copy(update={"diffusion": profile.diffusion.model_copy(update={"churn": 0.0})})
    dtype = compute_dtype(prof) if device.type == "cuda" else torch.float32
    workload = Workload.from_profile(prof, samples=prof.infer.batch_size, packed=False)
    b = workload.samples
    g = torch.Generator().manual_seed(0)
    text = torch.randn((b, workload.text_tokens, prof.model.text_dim), generator=g)
    mask = torch.ones(b, workload.text_tokens, dtype=torch.bool)
    seeds = list(range(b))

    def model() -> torch.nn.Module:
        torch.manual_seed(prof.train.seed)
        built = build_model(prof.model, device=device, dtype=dtype).eval()
        with torch.no_grad():  # adaLN-Zero starts every block at the identity and the output at zero:
            for p in built.parameters():  # perturbed, the latents depend on every layer's attention
                p.add_(0.05 * torch.randn_like(p))
        return built

    plan = InferPlan.choose(world, prof.diffusion.guidance, prof.model, prof.infer.tp, prof.parallel.cp_impl)
    check_plan(plan, prof)  # before anything is measured
    parallel = parallel_sampler(model(), prof, plan, str(device), profile_slicing(prof))
    one = model() if runtime.rank == 0 else None
    watch = Stopwatch(device)
    single_s, parallel_s = [], []
    latents: dict[str, torch.Tensor] = {}

    def timed(name: str, sampler: Sampler, seconds: list[float] | None) -> None:
        watch.start()
        latents[name] = sampler(text, mask, seeds, workload.latent, None)
        if seconds is not None:
            seconds.append(watch.stop())

    # bench.warmup rounds untimed, then bench.repeats timed. Each round samples once in one process (rank
    # 0 alone, the others waiting at the barrier) and once on the N ranks: alternating, a machine whose
    # load drifts during the run moves both measurements alike.
    for i in range(prof.bench.warmup + prof.bench.repeats):
        timing = i >= prof.bench.warmup
        if one is not None:
            timed("single", lambda *args: sample_latents(one, prof, *args), single_s if timing else None)
        dist.barrier()
        timed("parallel", parallel, parallel_s if timing else None)
        dist.barrier()
    if one is None:
        return {}
    single, split = Timing(tuple(single_s)), Timing(tuple(parallel_s))
    steps = prof.diffusion.steps
    rows = []
    for layout, ranks, timing in (("1 process", 1, single), (plan.describe(), world, split)):
        speedup = single.median / timing.median
        rows.append(
            ScalingRow(
                layout,
                ranks,
                timing.median,
                timing.median / steps,
                timing.spread,
                speedup,
                speedup / ranks,
            )
        )
    return {
        "profile": prof.name,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "workload": workload.describe(),
        "sampler": prof.diffusion.sampler,
        "steps": steps,
        "guidance_scale": prof.diffusion.guidance,
        "max_abs_diff": float(
            (latents["parallel"].float().cpu() - latents["single"].float().cpu()).abs().max()
        ),
        "rows": [asdict(r) for r in rows],
    }
