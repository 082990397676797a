"""`vidforge infer`: prompts -> text encoder -> sampler over the DiT -> tokenizer decode -> MP4 + PNG.

The checkpoint is a training run directory (its `export/`) or an export folder itself; its `profile.yaml`
is the base profile, so the tokenizer and text encoder are the ones the model was trained with. Or a
published folder as downloaded (e.g. diffusers' Wan2.1 transformer or pipeline): sampled as published
(`vidforge.weights.weights_folder.published_profile`: for Wan its transformer, rectified flow with UniPC
and the scheduler's shift, the pipeline's VAE and umT5).

The jobs live apart: which weights and which profile (`infer.weights`, through
`vidforge.weights.weights_folder`), which sampling loop runs the network (`infer.modes`: two experts,
several ranks as `infer.plan` shares them, or one process), the loop itself (shared with training's
validation, `vidforge.sampling`), and writing (`infer.output`); this module runs them in order.

Several ranks (`vidforge infer --nproc N`, torchrun) share each batch of prompts (`infer.plan.InferPlan`):
- with infer.tp > 1, groups of tp ranks hold the model tensor-parallel (the training's TP plan, applied
  by `vidforge.parallel.parallelize.apply_tensor_parallel`), for a model that does not fit one GPU;
- with guidance and an even number of such groups, the conditional and unconditional branches run on two
  halves of them (CFG-parallel), so N = 2 needs no sequence split at all;
- the ranks of each half split the token sequence: an ST-DiT whose profile says cp_impl=st-spatial by
  (h, w) positions (any frame count), any other sequential ST-DiT with ScaleFusion's overlapped
  spatial/temporal all-to-alls, any other model with context-parallel denoising
  (`vidforge.sampling.latents.sample_latents_cp`) with the profile's parallel.cp_impl for a DiT or Wan
  (all-gather, ring, ulysses, usp: installed by `apply_context_parallel`, training's own dispatcher) and
  st-hybrid for a parallel ST-DiT.
Every rank ends with the same latents; rank 0 decodes and writes the videos."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vidforge.data.folder_lock import FolderLock
from vidforge.errors import UserInputError
from vidforge.estimate.param_counts import require_model
from vidforge.infer.image import first_frame_latent
from vidforge.infer.image_condition import ImageCondition, channel_condition, image_size_sets
from vidforge.infer.modes import choose_sampler
from vidforge.infer.output import InferResult, SampleWriter, sample_settings, summary_note
from vidforge.infer.plan import Sampler
from vidforge.infer.weights import adapter_sampling, find_weights, load_network, sampling_profile
from vidforge.memory import device_memory_bytes, host_memory_bytes, require
from vidforge.parallel.scalefusion import ScaleFusionSlicing
from vidforge.profile import RunProfile
from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
from vidforge.profile.overrides import Settings, as_overrides
from vidforge.sampling.negative import negative_caption, negative_prompt
from vidforge.sampling.shape import check_shape
from vidforge.sampling.step_cache import StepCache
from vidforge.text.encoders import build_text_encoder
from vidforge.tokenizers.base import build_tokenizer
from vidforge.tokenizers.tokenize import decode


def check_memory(
    profile: RunProfile, latent_shape: Sequence[int], prompts: int, device: torch.device, world: int
) -> None:
    """Refuse, before anything loads, a size this machine cannot hold, by lower bounds: the model's
    parameters at 2 bytes; per batch, the latents the sampler holds at once in fp32 (its state and the
    model's prediction, and the unconditional one under guidance); on the host, the decoded video in
    fp32 and every video kept for the contact sheet. (`--frames 65 --height 1024 --width 1024` on a CPU went
    past 6 GB in 21 s without this check; at 16384x16384 it would ask for terabytes.)"""
    cfg = profile.infer
    size = f"infer.frames x height x width = {cfg.frames} x {cfg.height} x {cfg.width}"
    fix = "lower infer.frames, infer.height or infer.width (or infer.batch_size)"
    # every expert stays on the device (a two-expert model switches between them within a video)
    require_model(
        profile.model,
        2,
        world,
        device,
        "sample with a smaller model, or on more ranks",
        profile.model.experts,
    )
    held = 3 if profile.diffusion.guidance != 1 else 2
    batch = min(cfg.batch_size, prompts)
    require(
        batch * held * math.prod(latent_shape) * 4,
        device_memory_bytes(device),
        f"{size} (latents {' x '.join(map(str, latent_shape))}, {batch} a batch, {held} held at once)",
        fix,
    )
    video = cfg.frames * cfg.height * cfg.width * 3
    require(video * 4 + prompts * video, host_memory_bytes(), f"{size} ({prompts} video(s) decoded)", fix)


def run(
    checkpoint: str | Path,
    prompts: Sequence[str],
    out: str | Path,
    *,
    overrides: Settings = (),
    profile: str | None = None,
    slicing: ScaleFusionSlicing | None = None,
    log: Any = None,
    lora: str | Path | None = None,
    lora_scale: float = 1.0,
    image: str | Path | None = None,
) -> InferResult:
    """Sample a video per prompt into `out`. Under torchrun (or with a process group already initialised)
    the ranks share the work as `InferPlan` says; `slicing` sets ScaleFusion's N_T, N_S, L_T, L_S (default:
    the profile's infer.scalefusion_*).
    `log(message)` is told the plan of a parallel run. `lora`: a LoRA run's adapter put on the checkpoint
    (its base), its output weighted by `lora_scale`. `image`: every video starts from this image, in one
    process (`vidforge.infer.image` for a model with model.expand_timesteps;
    `vidforge.infer.image_condition` for one with model.condition_channels, which needs it)."""
    from vidforge.parallel.runtime import init_runtime

    check_prompts(prompts)
    if lora is not None:  # a distilled LoRA student samples in its own steps; --set still wins
        overrides = [*adapter_sampling(lora), *as_overrides(overrides)]
    weights = find_weights(checkpoint)
    prof = sampling_profile(weights, overrides, profile)
    if image is not None and profile is None:  # the size the family's pipeline picks for it, unless given
        sized = image_size_sets(prof, image, overrides)
        prof = sampling_profile(weights, [*sized, *as_overrides(overrides)], profile) if sized else prof
    # a checkpoint trained on GPUs still samples on a machine without one
    runtime = init_runtime(prof, device="auto" if prof.cluster.accelerator.kind == "cuda" else "cpu")
    rank, world, device = runtime.rank, runtime.world, str(runtime.device)
    # the layout rulebook's refusals of this run (its processes, an image or not), before anything loads
    refused = sampling_run_problems(prof, SamplingRun(world, image is not None))
    if refused:
        raise UserInputError(refused[0])
    tokenizer = build_tokenizer(prof, device=device)
    latent_shape = check_shape(prof, tokenizer)
    channels, first_frame = image_conditioning(prof, tokenizer, image)
    check_memory(prof, latent_shape, len(prompts), runtime.device, world)
    # One run writes an output folder at a time: two on one -o both finished, samples.jsonl the last's.
    lock = FolderLock(out) if rank == 0 else None
    encoder = build_text_encoder(prof)
    model = load_network(weights, device, lora, lora_scale, prof.model)
    if model.config.text_dim != encoder.width:
        raise UserInputError(
            f"text_encoder: gives {encoder.width}-wide states but the model was trained on text_dim={model.config.text_dim}"
        )
    tell = log if rank == 0 else None
    sampler, cache = choose_sampler(
        model, prof, latent_shape, world, device, channels, first_frame, lora, slicing, tell
    )
    negative = negative_caption(prof, encoder)
    settings = sample_settings(
        prof, checkpoint, weights.export, negative_prompt(prof), image, lora, lora_scale
    )
    writer = SampleWriter(Path(out), prof.infer.fps, prof.infer.crf, settings) if rank == 0 else None
    started = time.perf_counter()
    calls, skipped = sample_batches(
        prompts, prof, encoder, tokenizer, sampler, cache, latent_shape, negative, writer
    )
    seconds = time.perf_counter() - started
    if writer is None:
        return InferResult([], "", seconds, 0.0)
    sheet = writer.finish(summary_note(settings, prof.infer.cache.threshold, calls, skipped))
    if lock is not None:
        lock.release()
    return writer.result(sheet, seconds, calls, skipped)


def check_prompts(prompts: Sequence[str]) -> None:
    if not prompts or any(not p.strip() for p in prompts):
        raise UserInputError(
            "--prompt: give at least one non-empty prompt (or --prompts-file with one per line)"
        )


def image_conditioning(
    prof: RunProfile, tokenizer, image: str | Path | None
) -> tuple[ImageCondition | None, torch.Tensor | None]:
    """An image-to-video model's conditioning on `image`: condition channels read beside the latents
    (Wan2.1-I2V), or else the image's latent as the first frame (model.expand_timesteps, Wan2.2 TI2V)."""
    channels = channel_condition(prof, tokenizer, image)
    first_frame = None
    if channels is None and image is not None:
        first_frame = first_frame_latent(prof, tokenizer, image)
    return channels, first_frame


def sample_batches(
    prompts: Sequence[str],
    prof: RunProfile,
    encoder,
    tokenizer,
    sampler: Sampler,
    cache: StepCache | None,
    latent_shape: Sequence[int],
    negative: tuple[torch.Tensor, torch.Tensor] | None,
    writer: SampleWriter | None,
) -> tuple[int, int]:
    """Sample the prompts infer.batch_size at a time (prompt i's noise from infer.seed + i), each video
    decoded and handed to `writer` (rank 0's; None elsewhere). Returns (model calls, calls skipped by the
    step cache) over all batches."""
    calls = skipped = 0
    size = prof.infer.batch_size
    for first in range(0, len(prompts), size):
        chunk = list(prompts[first : first + size])
        emb, mask = encoder.encode_to_sample(chunk)
        seeds = [prof.infer.seed + first + i for i in range(len(chunk))]
        before = (cache.calls, cache.skipped) if cache is not None else (0, 0)
        latents = sampler(emb, mask, seeds, latent_shape, negative)
        # every video of a batch took its batch's calls (one decision a call, see sampling.step_cache)
        batch_calls = cache.calls - before[0] if cache is not None else None
        batch_skipped = cache.skipped - before[1] if cache is not None else None
        calls += batch_calls or 0
        skipped += batch_skipped or 0
        if writer is None:
            continue
        for i, (prompt, seed) in enumerate(zip(chunk, seeds, strict=True)):
            frames = decode(tokenizer, latents[i].float().cpu())
            writer.add(first + i, prompt, seed, frames, model_calls=batch_calls, skipped_calls=batch_skipped)
    return calls, skipped
