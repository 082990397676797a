"""`vidforge infer`: prompts -> text encoder -> sampler over the DiT -> tokenizer decode -> MP4 + PNG.

The checkpoint is a training run directory (its `export/`) or an export folder itself; its `profile.yaml`
is the base profile, so the tokenizer and text encoder are the ones the model was trained with. Or a
published folder as downloaded (e.g. diffusers' Wan2.1 transformer or pipeline): sampled as published
(`vidforge.models.weights_folder.published_profile`: for Wan its transformer, rectified flow with UniPC
and the scheduler's shift, the pipeline's VAE and umT5).

Several ranks (`vidforge infer --nproc N`, torchrun) share each batch of prompts (`InferPlan`):
- with infer.tp > 1, groups of tp ranks hold the model tensor-parallel (the training's TP plan, applied
  by `vidforge.parallel.parallelize.apply_tensor_parallel`), for a model that does not fit one GPU;
- with guidance and an even number of such groups, the conditional and unconditional branches run on two
  halves of them (CFG-parallel), so N = 2 needs no sequence split at all;
- the ranks of each half split the token sequence: an ST-DiT whose profile says cp_impl=st-spatial by
  (h, w) positions (any frame count), any other sequential ST-DiT with ScaleFusion's overlapped
  spatial/temporal all-to-alls, any other model with context-parallel denoising
  (`vidforge.infer.sampling.sample_latents_cp`) with the profile's parallel.cp_impl for a DiT or Wan
  (all-gather, ring, ulysses, usp: installed by `apply_context_parallel`, training's own dispatcher) and
  st-hybrid for a parallel ST-DiT.
Every rank ends with the same latents; rank 0 decodes and writes the videos."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidforge.data.folder_lock import FolderLock
from vidforge.data.manifest import write_jsonl
from vidforge.errors import UserInputError
from vidforge.infer.sampling import sample_latents
from vidforge.infer.step_cache import StepCache, rescale_name
from vidforge.infer.writers import contact_sheet, write_mp4
from vidforge.memory import device_memory_bytes, host_memory_bytes, require, require_model
from vidforge.models import load_model, weights_folder
from vidforge.models.checkpoint import CONFIG
from vidforge.models.weights_folder import WeightsFolder
from vidforge.parallel.scalefusion import ScaleFusionSlicing
from vidforge.profile import RunProfile
from vidforge.profile.layout_rules import sampling_layout_problems
from vidforge.profile.parallel import Layout, Parallel
from vidforge.text.encoders import build_text_encoder
from vidforge.tokenizers.base import VideoTokenizer, build_tokenizer
from vidforge.tokenizers.tokenize import decode


def find_weights(checkpoint: str | Path) -> WeightsFolder:
    """The checkpoint as an export (a run directory's export/ or an export folder) or a published
    folder (`vidforge.models.weights_folder`); a LoRA adapter or anything else is a UserInputError."""
    found = weights_folder.find_weights(checkpoint)
    if found is not None:
        return found
    from vidforge.train.lora import is_adapter_folder

    path = Path(checkpoint)
    if is_adapter_folder(path) or is_adapter_folder(path / "export"):
        raise UserInputError(
            f"--checkpoint {checkpoint}: a LoRA adapter, not a model; pass its base as --checkpoint and this "
            "folder as --lora"
        )
    return weights_folder.resolve_weights(checkpoint, "--checkpoint")


def find_export(checkpoint: str | Path) -> Path | None:
    """The folder holding model.safetensors + config.json: CHECKPOINT/export or CHECKPOINT itself; None
    for a published folder; otherwise a UserInputError."""
    return find_weights(checkpoint).export


def exported_step(export: Path) -> int | None:
    """The training step an export's weights are from (`vidforge.train.export.record_step` writes it);
    None for an export written before steps were recorded."""
    return json.loads((export / CONFIG).read_text()).get("step")


def checkpoint_profile(export: Path, overrides: Sequence[str], profile: str | None = None) -> RunProfile:
    """The profile the model trained with (or `profile` if given), with `overrides` applied."""
    return weights_folder.export_profile(export, overrides, profile)


def check_shape(profile: RunProfile, tokenizer: VideoTokenizer) -> tuple[int, int, int, int]:
    """The latent shape for profile.infer's frames x height x width, or a UserInputError saying what fits."""
    cfg, (pt, ph, pw) = profile.infer, profile.model.patch
    ct, cs = tokenizer.temporal_compression, tokenizer.spatial_compression
    if (cfg.frames - 1) % ct:
        raise UserInputError(
            f"infer.frames: the tokenizer needs {ct}k+1 frames, got {cfg.frames}; e.g. --set infer.frames={ct * ((cfg.frames - 1) // ct) + 1}"
        )
    for name, size, patch in (("height", cfg.height, ph), ("width", cfg.width, pw)):
        if size % (cs * patch):
            raise UserInputError(
                f"infer.{name}: must be a multiple of {cs * patch} (tokenizer {cs}x x patch {patch}), got {size}"
            )
    shape = tokenizer.latent_shape(cfg.frames, cfg.height, cfg.width)
    if shape[1] % pt:
        raise UserInputError(f"infer.frames: {shape[1]} latent frames are not a multiple of the patch's {pt}")
    if shape[0] != profile.model.in_channels:
        raise UserInputError(
            f"tokenizer: gives {shape[0]} latent channels but the model takes model.in_channels={profile.model.in_channels}"
        )
    return shape


def check_memory(
    profile: RunProfile, latent_shape: Sequence[int], prompts: int, device: torch.device, world: int
) -> None:
    """Refuse, before anything loads, a size this machine cannot hold, by lower bounds: the model's
    parameters at 2 bytes; per batch, the latents the sampler holds at once in fp32 (its state and the
    model's prediction, and the unconditional one under guidance); on the host, the decoded video in
    fp32 and every video kept for the contact sheet. (`--frames 65 --height 1024 --width 1024` on a CPU went
    past 6 GB in 21 s before; at 16384x16384 it would ask for terabytes.)"""
    cfg = profile.infer
    size = f"infer.frames x height x width = {cfg.frames} x {cfg.height} x {cfg.width}"
    fix = "lower infer.frames, infer.height or infer.width (or infer.batch_size)"
    require_model(profile.model, 2, world, device, "sample with a smaller model, or on more ranks")
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


def slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit] or "prompt"


@dataclass
class InferResult:
    """What rank 0 wrote (other ranks of a parallel run return an empty result)."""

    videos: list[str]
    contact_sheet: str
    seconds: float
    seconds_per_video: float
    model_calls: int = 0
    """Network calls over all batches (a guided call runs both branches at once), skipped ones included."""
    skipped_calls: int = 0
    """Of those, the calls step caching (infer.cache) skipped."""


@dataclass(frozen=True)
class InferPlan:
    """How `world` ranks share sampling: `tp` tensor-parallel ranks (infer.tp) x `cfg` guidance branches
    (1 or 2) x `sp` sequence ranks; the sequence-parallel method (`scalefusion`, `context-parallel` or
    None for sp = 1) and, for context parallel, its `cp_impl`."""

    world: int
    cfg: int
    sp: int
    method: str | None
    tp: int = 1
    cp_impl: str | None = None

    @classmethod
    def choose(
        cls, world: int, guidance: float, config, tp: int = 1, cp_impl: str = "all-gather"
    ) -> InferPlan:
        """The plan for `world` ranks; `cp_impl` is the profile's parallel.cp_impl (an ST-DiT's attention
        is not full attention: its sequence split is ScaleFusion or st-hybrid whatever the profile says)."""
        if world % tp:
            raise UserInputError(
                f"infer.tp: {tp} does not divide --nproc {world} (the model is held by groups of infer.tp "
                "ranks); change infer.tp or --nproc"
            )
        groups = world // tp
        stdit = config.architecture == "stdit"
        # An ST-DiT slices by positions when the profile says st-spatial (any frame count), else by frames:
        # ScaleFusion for the sequential block, st-hybrid for the parallel one.
        spatial = stdit and cp_impl == "st-spatial"
        scalefusion = stdit and config.stdit_block == "sequential" and not spatial
        cfg = 2 if guidance != 1.0 and groups % 2 == 0 else 1
        sp = groups // cfg
        method = None if sp == 1 else ("scalefusion" if scalefusion else "context-parallel")
        impl = None
        if method == "context-parallel":
            impl = cp_impl if spatial or not stdit else "st-hybrid"
        return cls(world, cfg, sp, method, tp, impl)

    def layout(self) -> Layout:
        """The plan as a mesh layout: the guidance pair holds the same weights and tokens, as data-parallel
        replicas do, so it takes the dp_replicate dimension; the sequence ranks cp; tp innermost, as in
        training (the fastest links)."""
        return Layout(pp=1, dp_replicate=self.cfg, dp_shard=1, cp=self.sp, tp=self.tp)

    def describe(self) -> str:
        names = {"scalefusion": "ScaleFusion sequence parallel", "context-parallel": "context parallel"}
        sequence = f"{names[self.method]} x{self.sp}" if self.method else ""
        # all-gather is a DiT's default and st-hybrid an ST-DiT's only method: named when the profile chose
        if self.cp_impl not in (None, "all-gather", "st-hybrid"):
            sequence += f" ({self.cp_impl})"
        parts = (
            ([f"tensor parallel x{self.tp}"] if self.tp > 1 else [])
            + (["CFG-parallel x2"] if self.cfg == 2 else [])
            + ([sequence] if sequence else [])
        )
        return " and ".join(parts) or "one rank"


def sampling_parallel(profile: RunProfile, plan: InferPlan) -> Parallel:
    """The profile's parallel section with the plan's cp_impl (st-hybrid for an ST-DiT)."""
    return profile.parallel.model_copy(update={"cp_impl": plan.cp_impl or profile.parallel.cp_impl})


def check_plan(plan: InferPlan, profile: RunProfile, lora: object = None) -> None:
    """Refuse a plan the model cannot be sampled with, in one line saying what to change: the layout
    rulebook's model rules (heads over tp, and over tp x cp for Ulysses; the multimodal block), and what
    tensor-parallel sampling does not combine with."""
    where = f"--nproc {plan.world} ({plan.describe()})"
    if plan.tp > 1 and plan.method == "scalefusion":
        raise UserInputError(
            f"infer.tp: {where}: ScaleFusion (the sequential ST-DiT's sequence split) has no tensor-parallel "
            f"path; set infer.tp=1, or use --nproc {plan.tp * plan.cfg} so the sequence is not split"
        )
    if plan.tp > 1 and lora is not None:
        raise UserInputError(
            f"--lora: LoRA adapters have no tensor-parallel plan (infer.tp={plan.tp}); set infer.tp=1"
        )
    used = profile.model_copy(update={"parallel": sampling_parallel(profile, plan)})
    problems = sampling_layout_problems(used, plan.layout())
    if problems:  # the rulebook names the training fields; sampling's tp and cp come from these
        problem = problems[0].replace("parallel.tp", "infer.tp")
        if problem.startswith("parallel.cp"):
            problem += (
                f" (sampling's cp is --nproc / (infer.tp x guidance branches) = {plan.sp}: change --nproc)"
            )
        raise UserInputError(f"{where}: {problem}")


def check_sequence_split(plan: InferPlan, config, latent_shape: Sequence[int]) -> None:
    """ST-DiT's frame slicing (ScaleFusion, st-hybrid) puts whole frames, and then whole positions, on every
    rank: the token grid's T and H*W must divide by the sequence ranks; st-spatial's position slicing takes
    any T and needs a position of every frame on each rank. A UserInputError saying what to change if not."""
    if plan.sp == 1 or config.architecture != "stdit":
        return
    from vidforge.tokens import token_grid

    t, h, w = token_grid(tuple(latent_shape)[1:], config.patch)
    if plan.cp_impl == "st-spatial":
        if h * w < plan.sp:
            raise UserInputError(
                f"--nproc {plan.world}: {plan.describe()} gives each rank (h, w) positions of every frame, but "
                f"the token grid has {h * w} a frame; raise infer.height / infer.width or use another --nproc"
            )
        return
    if t % plan.sp or (h * w) % plan.sp:
        raise UserInputError(
            f"--nproc {plan.world}: {plan.describe()} splits the {t} x {h} x {w} token grid's frames (T={t}) and "
            f"positions (H*W={h * w}) over {plan.sp} ranks; change infer.frames, infer.height or infer.width so "
            f"both divide by {plan.sp}, or use another --nproc"
        )


Sampler = Callable[..., torch.Tensor]
"""(text, mask, seeds, latent_shape, negative) -> latents (B, C, T, H, W), the same on every rank."""


def parallel_sampler(
    model, prof: RunProfile, plan: InferPlan, device: str, slicing: ScaleFusionSlicing
) -> Sampler:
    """Make `model` (whole, on every rank) parallel as `plan` says, in place, and return the function that
    samples with it over the process groups built here (every rank calls both in the same order)."""
    from vidforge.parallel.dims import ParallelDims
    from vidforge.parallel.parallelize import apply_context_parallel, apply_tensor_parallel

    dims = ParallelDims(plan.layout(), torch.device(device).type)
    cfg_group = dims.mesh["dp_replicate"].get_group() if plan.cfg == 2 else None
    if plan.tp > 1:
        apply_tensor_parallel(model, dims, prof)
    if plan.method == "context-parallel":
        from vidforge.infer.sampling import sample_latents_cp

        apply_context_parallel(model, dims, sampling_parallel(prof, plan))
        cp_mesh = dims.mesh["cp"]

        def sampler(text, mask, seeds, shape, negative):
            return sample_latents_cp(
                model, prof, text, mask, seeds, shape, cp_mesh, negative, cfg_group=cfg_group
            )

        return sampler
    forward = None
    if plan.method == "scalefusion":
        from vidforge.parallel.scalefusion import scalefusion_network

        forward = scalefusion_network(model, dims.mesh["cp"].get_group(), slicing)

    def sampler(text, mask, seeds, shape, negative):
        return sample_latents(
            model, prof, text, mask, seeds, shape, negative, cfg_group=cfg_group, forward=forward
        )

    return sampler


def profile_slicing(prof: RunProfile) -> ScaleFusionSlicing:
    """ScaleFusion's N_T, N_S, L_T, L_S from the profile's infer.scalefusion_*."""
    cfg = prof.infer
    return ScaleFusionSlicing(
        cfg.scalefusion_slices_t,
        cfg.scalefusion_slices_s,
        cfg.scalefusion_lookahead_t,
        cfg.scalefusion_lookahead_s,
    )


def run(
    checkpoint: str | Path,
    prompts: Sequence[str],
    out: str | Path,
    *,
    overrides: Sequence[str] = (),
    profile: str | None = None,
    slicing: ScaleFusionSlicing | None = None,
    log: Any = None,
    lora: str | Path | None = None,
    lora_scale: float = 1.0,
) -> InferResult:
    """Sample a video per prompt into `out`. Under torchrun (or with a process group already initialised)
    the ranks share the work as `InferPlan` says; `slicing` sets ScaleFusion's N_T, N_S, L_T, L_S (default:
    the profile's infer.scalefusion_*).
    `log(message)` is told the plan of a parallel run. `lora`: a LoRA run's adapter put on the checkpoint
    (its base), its output weighted by `lora_scale`."""
    from vidforge.parallel.runtime import init_runtime

    if not prompts or any(not p.strip() for p in prompts):
        raise UserInputError(
            "--prompt: give at least one non-empty prompt (or --prompts-file with one per line)"
        )
    weights = find_weights(checkpoint)
    export = weights.export
    if export is not None:
        prof = checkpoint_profile(export, overrides, profile)
    else:  # a published folder, sampled as published
        prof = weights_folder.published_profile(weights.published, overrides, profile)
    # a checkpoint trained on GPUs still samples on a machine without one
    runtime = init_runtime(prof, device="auto" if prof.cluster.accelerator.kind == "cuda" else "cpu")
    rank, world, device = runtime.rank, runtime.world, str(runtime.device)
    if world == 1 and prof.infer.tp > 1:  # before anything loads
        raise UserInputError(
            f"infer.tp: {prof.infer.tp} ranks hold the model tensor-parallel, but one process runs; "
            f"use --nproc {prof.infer.tp} (or a multiple), or set infer.tp=1"
        )
    tokenizer = build_tokenizer(prof, device=device)
    latent_shape = check_shape(prof, tokenizer)
    check_memory(prof, latent_shape, len(prompts), runtime.device, world)
    # One run writes an output folder at a time: two on one -o both finished, samples.jsonl the last's.
    lock = FolderLock(out) if rank == 0 else None
    encoder = build_text_encoder(prof)
    if export is not None:
        model = load_model(export, device=device).eval()
    else:
        model = weights_folder.load_published(weights.published, device=device).eval()
    if lora is not None:
        from vidforge.train.lora import load_adapter

        model = load_adapter(model, lora, lora_scale).eval()
    if model.config.text_dim != encoder.width:
        raise UserInputError(
            f"text_encoder: gives {encoder.width}-wide states but the model was trained on text_dim={model.config.text_dim}"
        )
    if world > 1:
        plan = InferPlan.choose(
            world, prof.diffusion.guidance, model.config, prof.infer.tp, prof.parallel.cp_impl
        )
        if log is not None and rank == 0:
            log(f"{world} ranks: {plan.describe()}")
        check_plan(plan, prof, lora)
        check_sequence_split(plan, model.config, latent_shape)
        if prof.infer.cache.threshold > 0:
            raise UserInputError(
                f"infer.cache.threshold: step caching runs in one process, not over --nproc {world}; "
                "set infer.cache.threshold=0 or drop --nproc"
            )
        sampler = parallel_sampler(model, prof, plan, device, slicing or profile_slicing(prof))
        cache = None  # the ranks' calls are not counted
    else:
        setting = prof.infer.cache
        cache = StepCache(setting.threshold, rescale_name(setting.rescale, model.config))

        def sampler(text, mask, seeds, shape, negative):
            return sample_latents(model, prof, text, mask, seeds, shape, negative, cache=cache)

    negative = None
    if prof.infer.negative_prompt:
        neg_emb, neg_mask = encoder.encode([prof.infer.negative_prompt])
        negative = (torch.from_numpy(neg_emb.astype(np.float32)), torch.from_numpy(neg_mask))

    out = Path(out)
    writer = rank == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records, videos, labels = [], [], []
    calls = skipped = 0
    # What every sample came from, for `vidforge review` and whoever compares samples later.
    settings = {
        "sampler": prof.diffusion.sampler,
        "steps": prof.diffusion.steps,
        "guidance": prof.diffusion.guidance,
        "negative_prompt": prof.infer.negative_prompt or None,
        "cache_threshold": prof.infer.cache.threshold,
        "checkpoint_step": exported_step(export) if export is not None else None,
        "checkpoint": str((export if export is not None else Path(checkpoint)).resolve()),
        **({"lora": str(Path(lora).resolve()), "lora_scale": lora_scale} if lora is not None else {}),
    }
    size = prof.infer.batch_size
    for first in range(0, len(prompts), size):
        chunk = list(prompts[first : first + size])
        emb, mask = encoder.encode(chunk)
        seeds = [prof.infer.seed + first + i for i in range(len(chunk))]
        before = (cache.calls, cache.skipped) if cache is not None else (0, 0)
        latents = sampler(
            torch.from_numpy(emb.astype(np.float32)), torch.from_numpy(mask), seeds, latent_shape, negative
        )
        # every video of a batch took its batch's calls (one decision a call, see infer.step_cache)
        batch_calls = cache.calls - before[0] if cache is not None else None
        batch_skipped = cache.skipped - before[1] if cache is not None else None
        calls += batch_calls or 0
        skipped += batch_skipped or 0
        if not writer:
            continue
        for i, (prompt, seed) in enumerate(zip(chunk, seeds, strict=True)):
            frames = decode(tokenizer, latents[i].float().cpu())
            path = out / f"{first + i:03d}_{slug(prompt)}.mp4"
            write_mp4(path, frames, prof.infer.fps, prof.infer.crf)
            videos.append(frames)
            labels.append(prompt)
            records.append(
                {
                    "prompt": prompt,
                    "seed": seed,
                    "video": path.name,
                    "frames": len(frames),
                    "height": frames.shape[1],
                    "width": frames.shape[2],
                    **settings,
                    "model_calls": batch_calls,
                    "skipped_calls": batch_skipped,
                }
            )
    seconds = time.perf_counter() - started
    if not writer:
        return InferResult([], "", seconds, 0.0)
    sheet = out / "contact_sheet.png"
    note = f"{settings['sampler']} {settings['steps']} steps, guidance {settings['guidance']:g}"
    if settings["checkpoint_step"] is not None:
        note += f", step {settings['checkpoint_step']}"
    if skipped:
        note += f", infer.cache {prof.infer.cache.threshold:g}: {skipped} of {calls} calls skipped"
    contact_sheet(sheet, videos, labels, note=note)
    write_jsonl(out / "samples.jsonl", records)
    if lock is not None:
        lock.release()
    return InferResult(
        [str(out / r["video"]) for r in records],
        str(sheet),
        seconds,
        seconds / len(records),
        calls,
        skipped,
    )
