"""`vidforge train`: the training loop. Build (`vidforge.train.build`), the loader, resume, then a short
loop of `TrainStep`s (`vidforge.train.step`): the step owns the loss, the parallel layout's step and the
clipping; the loop owns the schedule, the skip policy, logging, checkpoints, validation and the export.
Every rank runs this function; under one process it runs without a process group."""

from __future__ import annotations

import resource
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vidforge.data.batching import build_batcher
from vidforge.data.blending import DataParallelSizeChanged
from vidforge.data.loader import GroupComm, ShardLoader
from vidforge.data.prefetch import Prefetcher
from vidforge.data.token_budget import require_token_budget
from vidforge.errors import Terminated, UserInputError
from vidforge.estimate.param_counts import require_model
from vidforge.estimate.recompute import resolve_auto
from vidforge.files import output_folder, subfolder, write_text
from vidforge.parallel.runtime import Runtime, init_runtime
from vidforge.profile import RunProfile, dump_profile
from vidforge.train.build import TrainParts, build
from vidforge.train.checkpoint import CheckpointManager, run_identity
from vidforge.train.distill import student_profile
from vidforge.train.export import export_weights
from vidforge.train.init_weights import WeightsInit
from vidforge.train.lr import learning_rate, resumed_schedule, schedule_state
from vidforge.train.make_step import make_train_step
from vidforge.train.metrics import MetricsLog, require_trackers
from vidforge.train.step import StepResult, TrainStep
from vidforge.train.threads import recorded_threads, restore_threads
from vidforge.train.validation import Validator, plan_validation

Progress = Callable[[dict[str, Any]], None]
FINAL_LOSS_WINDOW = 10  # logged losses averaged into the summary's final_loss_mean


class TrainingDiverged(RuntimeError):
    """The loss or the gradients stopped being finite."""


class WaitInterrupted(Exception):
    """SIGTERM arrived while the loop waited for its batches (`StopOnSigterm.waiting`)."""


class StopOnSigterm:
    """SIGTERM (what SLURM and Kubernetes send before they kill or preempt a job) noted while the loop runs,
    and acted on at the next step boundary: the loop saves a checkpoint there and stops with `Terminated`
    (exit 143 and a resume line) instead of dying with the steps since the last save. Every rank must stop
    at the same step (saving is collective), so `agreed` asks all of them each step: one int all-reduced.
    While the loop waits for data (`waiting`: a packer skipping samples, a slow store) a step boundary may
    be far off, so the signal interrupts the wait instead. The default handler is back once the loop ends."""

    def __init__(self) -> None:
        self.signalled = False
        self._waiting = False
        self._previous: Any = None

    def __enter__(self) -> StopOnSigterm:
        if threading.current_thread() is threading.main_thread():  # signals go to the main thread only
            self._previous = signal.signal(signal.SIGTERM, self._note)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _note(self, signum: int, frame: Any) -> None:
        self.signalled = True
        if self._waiting:
            raise WaitInterrupted

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A wait for batches that SIGTERM interrupts (`WaitInterrupted`), also one signalled before it."""
        if self.signalled:
            raise WaitInterrupted
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank was signalled (every rank gets the same answer)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.signalled
        flag = torch.tensor([int(self.signalled)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


@dataclass
class TrainSummary:
    run_dir: str
    start_step: int
    last_step: int
    final_loss_mean: float | None
    """The mean of the last `final_loss_window` logged losses (one step's loss is noisy: a spike at the
    last logged step is not where the run ended up); None when nothing was logged."""
    final_loss_window: int
    skipped_steps: int
    tokens_per_s: float
    step_time_s: float
    mfu: float
    hfu: float
    peak_memory_gib: float
    packing_efficiency: float | None
    export_dir: str | None
    notes: list[str] = field(default_factory=list)


def _peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB: process RSS


def run(
    profile: RunProfile,
    data: Sequence[str | Path],
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: Progress | None = None,
    init: WeightsInit | None = None,
    on_step: Callable[[int], None] | None = None,
    labels: Mapping[str, Any] | None = None,
    notice: Callable[[str], None] | None = None,
    fine_tune: bool | None = None,
) -> TrainSummary:
    """Train; `progress(record)` gets each logged metrics line, `on_step(step)` every finished step
    (rank 0 only, for a progress bar) and `notice(line)` what resuming and validation found (also in the
    summary's notes). `fine_tune` (default: started from `init` or training LoRA) turns validation on when
    the profile leaves train.validate_every unset. `labels` (a curriculum's `{"stage": name}`) go into every metrics
    line and every checkpoint's per-rank state."""
    session = _set_up(profile, data, Path(run_dir), resume, init, notice, fine_tune, dict(labels or {}))
    try:
        _train(session, progress, on_step, notice)
    finally:
        session.close()
    return _finish(session)


@dataclass
class _Session:
    """A run as its set-up leaves it: what the loop steps, saves, logs and validates with."""

    profile: RunProfile
    run_dir: Path
    runtime: Runtime
    init: WeightsInit | None
    labels: dict[str, Any]
    checkpoints: CheckpointManager
    parts: TrainParts
    step_fn: TrainStep
    batcher: Any
    schedule: Any
    step: int
    extra: dict[str, Any]
    validation: Any
    validator: Validator
    metrics: MetricsLog
    window: _Window
    notes: list[str]
    start_step: int = 0
    skipped: int = 0
    saved: int = 0
    closed: bool = False
    logged_losses: deque[float] = field(default_factory=lambda: deque(maxlen=FINAL_LOSS_WINDOW))

    def save(self) -> None:
        _save(self.checkpoints, self.step, self.parts, self.batcher, self.extra)
        self.saved = self.step

    def close(self) -> None:
        """Wait for checkpoint writes, close the metrics and the data thread (again: a no-op)."""
        if self.closed:
            return
        self.closed = True
        self.checkpoints.wait()
        self.metrics.close()
        if isinstance(self.batcher, Prefetcher):
            self.batcher.close()


def _set_up(
    profile: RunProfile,
    data: Sequence[str | Path],
    run_dir: Path,
    resume: bool,
    init: WeightsInit | None,
    notice: Callable[[str], None] | None,
    fine_tune: bool | None,
    labels: dict[str, Any],
) -> _Session:
    """Everything checked that can refuse the run, then the model, its step, the data and the resumed
    state built."""
    profile, _ = resolve_auto(profile)  # train.activation_checkpointing=auto: the memory model's mix
    teacher = None
    if profile.train.distill is not None:
        profile = student_profile(profile)  # what validation, profile.yaml and the export sample with
        teacher = _teacher(profile.train.distill.teacher, init)
        init = init if init is not None else teacher  # the student starts from the teacher
    cfg = profile.train
    require_token_budget(profile)
    runtime = init_runtime(profile)
    runtime.require_layout(profile.cluster)
    checkpoints = CheckpointManager(run_dir, keep=cfg.keep_checkpoints, use_async=cfg.async_checkpoint)
    latest = checkpoints.latest()
    if latest is not None and not resume:
        raise UserInputError(
            f"{run_dir} already holds checkpoints (latest step {latest}); pass --resume or a new --run-dir"
        )
    if resume and latest is not None and cfg.lora is not None and init is None:
        raise UserInputError(
            "--resume: a LoRA run's checkpoints hold its adapters alone (train.lora); pass the --init it "
            "started from again"
        )
    require_trackers(cfg.trackers)
    identity = run_identity(
        profile.model,
        cfg.lora,
        str(Path(init.src).resolve()) if init is not None else None,
        str(Path(teacher.src).resolve()) if teacher is not None else None,
    )
    if resume and latest is not None:
        checkpoints.check_resume(latest, identity)  # before profile.yaml is rewritten and the model built
    # A LoRA base is frozen in the compute dtype; a trained weight has fp32 master, gradient, 2 AdamW states
    # (in host memory under train.fsdp_cpu_offload). A distillation trains a fake score as well, and holds
    # the frozen teacher.
    per_weight = 2 if cfg.lora is not None else 16
    require_model(
        profile.model,
        per_weight if cfg.distill is None else 2 * per_weight + 2,
        runtime.world,
        torch.device("cpu") if cfg.fsdp_cpu_offload else runtime.device,
        "lower model.hidden, model.layers or model.mlp_hidden (or pick a smaller model.preset), or train "
        "on more ranks",
    )
    if runtime.is_main:
        output_folder(run_dir)
        subfolder(run_dir, "export", create=False)  # a planted link refused now, not after the training
        write_text(run_dir / "profile.yaml", dump_profile(profile))
    parts = build(profile, runtime, init, teacher)
    step_fn = make_train_step(profile, runtime, parts)
    batcher = rank_batcher(profile, runtime, data)
    notes = list(parts.notes)
    schedule, step = cfg, 0
    if resume:
        before = len(notes)
        step, saved, threads = _resume(checkpoints, latest, parts, batcher, notes)
        schedule, changed = resumed_schedule(cfg, saved, step)
        notes += [changed] if changed else []
        restore_threads(threads, notes)
        if notice is not None and runtime.is_main:
            for line in notes[before:]:
                notice(line)
    if fine_tune is None:
        fine_tune = init is not None or cfg.lora is not None
    validation = plan_validation(profile, data, fine_tune)
    if validation.note:
        notes.append(validation.note)
        if notice is not None and runtime.is_main:
            notice(validation.note)
    return _Session(
        profile=profile,
        run_dir=run_dir,
        runtime=runtime,
        init=init,
        labels=labels,
        checkpoints=checkpoints,
        parts=parts,
        step_fn=step_fn,
        batcher=batcher,
        schedule=schedule,
        step=step,
        # each checkpoint's rank state
        extra={
            **labels,
            "run": identity,
            "schedule": schedule_state(schedule),
            "threads": recorded_threads(),
        },
        validation=validation,
        validator=Validator(profile, validation.prompts),
        metrics=MetricsLog(run_dir, runtime.is_main, step, cfg.trackers, profile.model_dump(mode="json")),
        window=_Window(profile, runtime),
        notes=notes,
        start_step=step,
        saved=step,
    )


def _train(
    s: _Session,
    progress: Progress | None,
    on_step: Callable[[int], None] | None,
    notice: Callable[[str], None] | None,
) -> None:
    """The steps from `s.step` to train.steps: the schedule, the skip policy, logging, checkpoints,
    validation, and a stop on SIGTERM."""
    cfg, runtime, step_fn = s.profile.train, s.runtime, s.step_fn
    skipped_in_row = 0
    for module in s.parts.modules:
        module.train()
    with StopOnSigterm() as stop:
        while s.step < cfg.steps:
            started = time.perf_counter()
            step_fn.set_lr(learning_rate(s.step, s.schedule))
            try:
                with stop.waiting():
                    batches = step_fn.next_batches(s.batcher)
            except WaitInterrupted:
                _terminate(s, in_wait=True)
            data_wait = time.perf_counter() - started
            if batches is None:
                s.notes.append(f"data ran out at step {s.step} (data.epochs={s.profile.data.epochs})")
                break
            result = step_fn(batches)
            s.step += 1
            if on_step is not None and runtime.is_main:
                on_step(s.step)
            if not result.finite:
                step_fn.zero_grad()
                s.skipped, skipped_in_row = s.skipped + 1, skipped_in_row + 1
                what = f"step {s.step - 1}: loss {result.loss}, gradient norm {result.grad_norm}"
                if cfg.nan_policy == "stop" or skipped_in_row > cfg.max_skipped_steps:
                    raise TrainingDiverged(
                        f"{what}; lower train.lr, keep train.grad_clip on, or set train.nan_policy=skip "
                        f"(skipped {s.skipped} step(s) so far)"
                    )
                s.notes.append(f"skipped {what}")
                continue
            skipped_in_row = 0
            step_fn.apply()
            s.window.add(result, started, data_wait)
            _after_step(s, result, progress, notice)
            if s.step < cfg.steps and stop.agreed(runtime.device):
                _terminate(s, in_wait=False)


def _after_step(
    s: _Session, result: StepResult, progress: Progress | None, notice: Callable[[str], None] | None
) -> None:
    """A finished step's metrics line, checkpoint and validation, each when due."""
    cfg, step = s.profile.train, s.step
    if step % cfg.log_every == 0 or step == cfg.steps:
        record = {**s.window.record(step, result, s.step_fn, s.batcher), **s.labels}
        s.metrics.write(record)
        s.logged_losses.append(record["loss"])
        if progress is not None and s.runtime.is_main:
            progress(record)
    if step % cfg.save_every == 0 or step == cfg.steps:
        s.save()
    if s.validation.due(step, cfg.steps):
        out = s.run_dir / "validation" / f"step_{step:08d}"
        samples = s.validator(s.parts.modules[0], s.parts.ema, out, s.runtime.rank)
        s.metrics.videos(step, samples)
        if notice is not None and s.runtime.is_main:
            notice(f"step {step}: validation videos of {len(samples)} prompt(s) in {out}")


def _terminate(s: _Session, in_wait: bool) -> None:
    """SIGTERM: save the steps since the last checkpoint and stop (exit 143), one message wherever the
    signal landed. Interrupted in a wait for data, the ranks are not at one boundary, so a collective save
    is taken only by a lone process."""
    if s.step > s.saved and (not in_wait or s.runtime.world == 1):
        s.save()
    s.close()
    latest = s.checkpoints.latest()
    saved = f"saved as {s.checkpoints.path(latest)}" if latest is not None else "no checkpoint yet"
    raise Terminated(
        f"terminated (SIGTERM) after step {s.step}, {saved}; rerun the same command with --resume to continue"
    )


def _finish(s: _Session) -> TrainSummary:
    """The last checkpoint and the export; the run's summary."""
    step = s.step
    if step > s.saved:
        s.save()
    s.checkpoints.wait()
    export_dir = None
    if step > 0:
        pp_group = s.parts.pipeline.group if s.parts.pipeline is not None else None
        export_dir = export_weights(
            s.profile,
            s.parts.modules,
            s.parts.ema,
            s.run_dir / "export",
            step,
            s.runtime.rank,
            pp_group=pp_group,
            base=str(Path(s.init.src).resolve()) if s.init is not None else None,
        )
    window, losses = s.window, s.logged_losses
    return TrainSummary(
        run_dir=str(s.run_dir),
        start_step=s.start_step,
        last_step=step,
        final_loss_mean=sum(losses) / len(losses) if losses else None,
        final_loss_window=len(losses),
        skipped_steps=s.skipped,
        tokens_per_s=window.tokens_per_s,
        step_time_s=window.step_time,
        mfu=window.mfu,
        hfu=window.hfu,
        peak_memory_gib=_peak_memory_gib(s.runtime.device),
        packing_efficiency=getattr(s.batcher, "efficiency", None),
        export_dir=str(export_dir) if export_dir else None,
        notes=s.notes,
    )


def _teacher(src: str | None, init: WeightsInit | None) -> WeightsInit:
    """train.distill's teacher weights: train.distill.teacher, else the run's --init."""
    if src is not None:
        if not Path(src).exists():
            raise UserInputError(
                f"train.distill.teacher: {src} does not exist; point it at the teacher's export, run "
                "directory or diffusers folder"
            )
        return WeightsInit(Path(src))
    if init is None:
        raise UserInputError(
            "train.distill: no teacher; set train.distill.teacher to its weights (an export, a run, a "
            "diffusers folder) or pass them as --init"
        )
    return init


def rank_batcher(profile: RunProfile, runtime: Runtime, data: Sequence[str | Path]) -> Any:
    """This rank's batches, `data.prefetch` ahead in a background thread. Ranks of one model-parallel group
    (tp x cp x pp) share a dp rank, so they get the same samples; the group reads each shard once and
    exchanges it (unless `data.mp_read` is `each`) on a gloo group of its own (`data_exchange_group`), so
    the prefetch thread's exchange never shares a group with the step's collectives."""
    dims = runtime.dims
    dp_rank = dims.flat("dp").get_local_rank() if dist.is_initialized() else 0
    mode = profile.data.mp_read
    exchange = dims.model_parallel > 1 and mode != "each"
    mp_group = GroupComm(dims.data_exchange_group(), mode) if exchange else None
    loader = ShardLoader.from_profile(
        profile, [str(p) for p in data], dp_rank=dp_rank, dp_size=dims.layout.dp, group=mp_group
    )
    batcher = build_batcher(profile, loader)
    if profile.data.prefetch:
        return Prefetcher(batcher, profile.data.prefetch, pin=runtime.device.type == "cuda")
    return batcher


def _save(
    checkpoints: CheckpointManager, step: int, parts: TrainParts, batcher: Any, extra: dict[str, Any]
) -> None:
    state = {"loader": batcher.state_dict(), **extra}
    checkpoints.save(step, parts.modules, parts.optimizers, parts.ema, state, parts.companions())


def _resume(
    checkpoints: CheckpointManager, latest: int | None, parts: TrainParts, batcher: Any, notes: list[str]
) -> tuple[int, dict[str, Any] | None, int | None]:
    """The step to continue from, with weights, optimizers, EMA and the data position restored, the
    schedule the checkpoint was trained with and its CPU thread count (each None for a fresh start or a
    checkpoint that predates it)."""
    if latest is None:
        notes.append("no complete checkpoint to resume from: started fresh")
        return 0, None, None
    extra = checkpoints.load(latest, parts.modules, parts.optimizers, parts.ema, parts.companions())
    step = extra["step"]
    notes.append(f"resumed from step {step}")
    try:
        batcher.load_state_dict(extra["loader"])
    except DataParallelSizeChanged as changed:
        # Weights and optimizer states reshard (DCP); a data position is per dp rank and cannot.
        notes.append(
            f"data-parallel size changed from {changed.saved} to {changed.now}: the model resumed "
            f"at step {step}, the data starts over from its first sample"
        )
    return step, extra.get("schedule"), extra.get("threads")


class _Window:
    """Throughput over the steps since the last log line: step time, tokens/s, MFU (model FLOPs) and HFU
    (hardware FLOPs: with activation recompute)."""

    def __init__(self, profile: RunProfile, runtime: Runtime) -> None:
        self.device = runtime.device
        self.peak = profile.cluster.accelerator.peak_bf16_flops * runtime.world
        self.step_time = self.tokens_per_s = self.mfu = self.hfu = 0.0
        self._reset()

    def _reset(self) -> None:
        self.time = self.tokens = self.flops = self.hardware_flops = self.data_wait = 0.0
        self.steps = 0

    def add(self, result: StepResult, started: float, data_wait: float) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.time += time.perf_counter() - started
        self.tokens += result.tokens
        self.flops += result.flops
        self.hardware_flops += result.hardware_flops
        self.data_wait += data_wait
        self.steps += 1

    def record(self, step: int, result: StepResult, step_fn: TrainStep, batcher: Any) -> dict[str, Any]:
        """The metrics.jsonl line of this step; starts the next window."""
        self.step_time = self.time / self.steps
        self.tokens_per_s = self.tokens / self.time
        self.mfu = self.flops / (self.time * self.peak)  # model FLOPs only: recompute is not progress
        self.hfu = self.hardware_flops / (self.time * self.peak)
        record = {
            "step": step,
            "loss": result.loss,
            "grad_norm": result.grad_norm,
            "lr": step_fn.parts.optimizers[0].param_groups[0]["lr"],
            "step_time_s": self.step_time,
            "data_wait_s": self.data_wait / self.steps,  # of each step's time, spent waiting for its batches
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_gib": _peak_memory_gib(self.device),
            **step_fn.by_level.means(),
            **result.extra,
        }
        if getattr(batcher, "efficiency", None) is not None:
            record["packing_efficiency"] = batcher.efficiency
        step_fn.by_level.reset()
        self._reset()
        return record


def summary_dict(summary: Any) -> dict[str, Any]:
    """A TrainSummary, or a curriculum's CurriculumSummary, as a plain dict."""
    return asdict(summary)
