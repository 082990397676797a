"""Training metrics: one JSON line per logged step in the run directory (metrics.jsonl), a console line,
and the trackers `train.trackers` names: TensorBoard scalars and validation frames (RUN/tensorboard/:
`tensorboard --logdir RUN`), Weights & Biases scalars and validation videos. Only rank 0 writes."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidforge.diffusion.objective import Objective
from vidforge.errors import UserInputError
from vidforge.files import open_append, write_text

log = logging.getLogger(__name__)


class LossByLevel:
    """The loss per noise level over a logging window: per-sample losses summed into the objective's
    buckets of its noise coordinate (`loss_sigma_0.1-0.5` for EDM), low noise (detail) to high (layout)."""

    def __init__(self, objective: Objective) -> None:
        self.edges = objective.level_bucket_edges
        bounds = ("0",) + tuple(f"{e:g}" for e in self.edges) + ("inf",)
        self.names = [
            f"loss_{objective.level_name}_{lo}-{hi}" for lo, hi in zip(bounds, bounds[1:], strict=False)
        ]
        self.reset()

    def reset(self) -> None:
        self._sums = [0.0] * len(self.names)
        self._counts = [0] * len(self.names)

    def add(self, level: torch.Tensor, per_sample_loss: torch.Tensor) -> None:
        edges = torch.tensor(self.edges, dtype=level.dtype, device=level.device)
        index = torch.bucketize(level.detach(), edges)
        for i in range(len(self.names)):
            hit = index == i
            self._sums[i] += float(per_sample_loss.detach()[hit].sum())
            self._counts[i] += int(hit.sum())

    def means(self) -> dict[str, float]:
        """Mean loss of each bucket that saw a sample."""
        return {n: total / c for n, total, c in zip(self.names, self._sums, self._counts, strict=True) if c}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A torn last line (a crash mid-write) is dropped with a warning; any
    other damaged line is a user error naming the file and line."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    complete = lines[-1] == ""  # every record ends in a newline: a last line without one was cut short
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("no integer step")
        except ValueError as err:
            if number == len(lines) and not complete:
                log.warning("%s:%d: dropped a torn last line (a run stopped while writing it)", path, number)
                continue
            raise UserInputError(
                f"{path}:{number}: not a metrics record ({err}); fix or delete that line, then resume"
            ) from None
        records.append(record)
    return records


TRACKER_FRAMES = 8  # frames of each validation video shown in TensorBoard (evenly spaced)


def require_trackers(trackers: Sequence[str]) -> None:
    """Refuse a tracker whose package is missing before anything is built."""
    if "wandb" in trackers and importlib.util.find_spec("wandb") is None:
        raise UserInputError(
            "train.trackers: wandb is not installed; `pip install wandb` (then `wandb login`, or "
            "WANDB_MODE=offline), or leave wandb out of train.trackers"
        )


class MetricsLog:
    def __init__(
        self,
        run_dir: str | Path,
        enabled: bool,
        resume_step: int = 0,
        trackers: Sequence[str] = ("tensorboard",),
        config: dict[str, Any] | None = None,
    ):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            # A resumed run rewrites the steps after its checkpoint: drop what the killed run logged past it.
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        if "tensorboard" in trackers:
            from torch.utils.tensorboard import SummaryWriter  # tensorboard is a dependency

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if "wandb" in trackers:
            self._wandb = _wandb_run(Path(run_dir), config or {})

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open_append(self.path) as f:
            f.write(json.dumps(clean, sort_keys=True) + "\n")
        scalars = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "step"}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, record["step"])
        if self._wandb is not None:
            self._wandb.log(scalars, step=record["step"])

    def videos(self, step: int, samples: Sequence[tuple[str, np.ndarray, Path]]) -> None:
        """Validation samples ((prompt, frames (T, H, W, 3) uint8, its MP4)): TensorBoard gets each as
        frames under `validation/<n>` (its videos need moviepy; images need nothing), W&B the MP4."""
        if not self.enabled:
            return
        for n, (prompt, frames, video) in enumerate(samples):
            if self._tb is not None:
                picked = frames[
                    np.linspace(0, len(frames) - 1, min(TRACKER_FRAMES, len(frames))).round().astype(int)
                ]
                self._tb.add_images(f"validation/{n}", picked, step, dataformats="NHWC")
                self._tb.add_text(f"validation/{n}/prompt", prompt, step)
            if self._wandb is not None:
                import wandb

                self._wandb.log({f"validation/{n}": wandb.Video(str(video), caption=prompt)}, step=step)
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _wandb_run(run_dir: Path, config: dict[str, Any]) -> Any:
    """One W&B run per run directory (its id from the directory's path, so --resume continues it)."""
    import wandb

    from vidforge.data.manifest import stable_id

    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", "vidforge"),
        name=run_dir.resolve().name,
        id=stable_id("vidforge-run", str(run_dir.resolve())),
        resume="allow",
        dir=str(run_dir),
        config=config,
    )
