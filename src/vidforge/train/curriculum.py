"""`vidforge train` with a curriculum (the profile's `stages`): one training run per stage, in order, each
handed its own profile (the stage's fields set, `vidforge.profile.checks.apply_stage`) and started from
the previous stage's EMA weights through the `--init` path (its latest checkpoint, read with DCP). The
loop (`vidforge.train.loop.run`) is the same one loop; the stage is what it is handed.

Layout of a curriculum's run directory:
    RUN/profile.yaml                  the whole profile, stages included
    RUN/stages/01-NAME/               the stage's run directory: profile.yaml (the stage's profile),
                                      checkpoints/, metrics.jsonl (each line carries `stage`), export/
    RUN/stages/01-NAME/STAGE_COMPLETE written once the stage has exported: --resume passes over it
                                      (unless the stage's steps have changed since: then it trains on)
    RUN/export -> stages/NN-LAST/export   the last stage's export, for `vidforge infer -c RUN`
A two-expert model (Wan2.2 A14B) trains one expert a stage (each stage's `expert`, train.expert): a stage
starts from its own expert's latest stage, or from --init's weights of that expert when it is the first
to train it, never from the other expert's. Each stage's export records the other expert's latest stage
export (`vidforge.weights.experts.record_pair`), so the last stage's export samples with both trained
experts (`infer -c RUN`, or `infer -c DOWNLOAD --lora RUN` for LoRA).
`--resume` skips the complete stages and resumes the first incomplete one from its latest checkpoint (or
starts it from the previous stage when it had saved none)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from vidforge.data.manifest import atomic_path
from vidforge.files import write_text
from vidforge.profile import RunProfile, dump_profile
from vidforge.profile.checks import apply_stage
from vidforge.profile.stages import Stage
from vidforge.train import loop
from vidforge.train.init_weights import WeightsInit
from vidforge.weights.experts import record_pair

STAGES = "stages"
DONE = "STAGE_COMPLETE"


@dataclass
class CurriculumSummary:
    run_dir: str
    stages: list[dict[str, Any]]
    """Each stage's name, folder and training summary (`skipped: true` for one --resume found complete)."""
    export_dir: str | None


def stage_dir(run_dir: str | Path, index: int, stage: Stage) -> Path:
    """The run directory of stage `index` (0-based)."""
    return Path(run_dir) / STAGES / f"{index + 1:02d}-{stage.name}"


def total_steps(profile: RunProfile) -> int:
    """Optimizer steps of the whole run: the stages' together, or train.steps without stages."""
    return sum(s.steps for s in profile.stages) if profile.stages else profile.train.steps


def run(
    profile: RunProfile,
    data: Sequence[str | Path],
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: loop.Progress | None = None,
    init: WeightsInit | None = None,
    on_step: Callable[[int], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> CurriculumSummary:
    """Run the profile's stages in order (see the module's docstring). `init` starts the first stage;
    `on_step` gets the step counted over the whole curriculum."""
    if not profile.stages:
        raise ValueError("curriculum.run needs a profile with stages; without them call loop.run")
    run_dir = Path(run_dir)
    main = not dist.is_initialized() or dist.get_rank() == 0
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / "profile.yaml", dump_profile(profile))
    summaries: list[dict[str, Any]] = []
    before = 0  # steps of the stages before this one
    previous: Path | None = None
    latest: dict[str | None, Path] = {}  # each expert's latest stage (None: a one-expert model's)
    for index, stage in enumerate(profile.stages):
        folder = stage_dir(run_dir, index, stage)
        staged = apply_stage(profile, stage)
        expert = staged.train.expert
        entry: dict[str, Any] = {"stage": stage.name, "run_dir": str(folder)}
        done = _done(folder)
        if resume and done.get("steps") == stage.steps:  # a stage given more steps since trains on
            summaries.append({**entry, **done["summary"], "skipped": True})
        else:
            # Stage 1 starts where --init says; each later one from the latest stage of its expert (the
            # stage before it, with one expert): its latest checkpoint's EMA weights (the raw ones when
            # that stage kept no EMA). An expert's first stage starts from its weights in --init.
            start = WeightsInit(latest[expert]) if expert in latest else init
            summary = loop.run(
                staged,
                data,
                folder,
                resume=resume,
                progress=progress,
                init=start,
                on_step=_offset(on_step, before),
                labels={"stage": stage.name},
                notice=notice,
                # a later stage starts from the one before: a fine-tune only if the first one was
                fine_tune=init is not None or profile.train.lora is not None,
            )
            summaries.append({**entry, **asdict(summary), "skipped": False})
            other = next((f for e, f in latest.items() if e not in (expert, None)), None)
            if main and other is not None and summary.export_dir and (other / "export").is_dir():
                record_pair(Path(summary.export_dir), other / "export")
            if main:
                with atomic_path(folder / DONE) as tmp:
                    tmp.write_text(json.dumps({"steps": stage.steps, "summary": asdict(summary)}))
        before += stage.steps
        previous = latest[expert] = folder
    export = _link_export(run_dir, previous) if main else None
    return CurriculumSummary(str(run_dir), summaries, str(export) if export else None)


def _done(folder: Path) -> dict[str, Any]:
    """What a complete stage recorded: its steps and its summary; {} for a stage not complete."""
    path = folder / DONE
    return json.loads(path.read_text()) if path.is_file() else {}


def _offset(on_step: Callable[[int], None] | None, before: int) -> Callable[[int], None] | None:
    if on_step is None:
        return None
    return lambda step: on_step(before + step)


def _link_export(run_dir: Path, last: Path | None) -> Path | None:
    """RUN/export, a link to the last stage's export (the weights once, however large)."""
    if last is None or not (last / "export").is_dir():
        return None
    link = run_dir / "export"
    if link.is_symlink():
        link.unlink()
    if not link.exists():
        os.symlink(os.path.relpath(last / "export", run_dir), link)
    return link
