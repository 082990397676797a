"""Training metrics: one JSON line per logged step in the run directory, a console line, and TensorBoard
scalars when tensorboard is installed. Only rank 0 writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

# Edges of log(sigma) buckets for the per-noise-level loss: low noise (detail) to high noise (layout).
SIGMA_BUCKET_EDGES = (0.1, 0.5, 1.0, 2.0, 5.0)


def sigma_bucket_names() -> list[str]:
    edges = ("0",) + tuple(f"{e:g}" for e in SIGMA_BUCKET_EDGES) + ("inf",)
    return [f"loss_sigma_{lo}-{hi}" for lo, hi in zip(edges, edges[1:], strict=False)]


def loss_by_sigma(sigma: torch.Tensor, per_sample_loss: torch.Tensor) -> dict[str, tuple[float, int]]:
    """Sum and count of the per-sample loss in each sigma bucket (summed over steps by the caller)."""
    edges = torch.tensor(SIGMA_BUCKET_EDGES, dtype=sigma.dtype, device=sigma.device)
    index = torch.bucketize(sigma.detach(), edges)
    out = {}
    for i, name in enumerate(sigma_bucket_names()):
        hit = index == i
        out[name] = (float(per_sample_loss.detach()[hit].sum()), int(hit.sum()))
    return out


class MetricsLog:
    def __init__(self, run_dir: str | Path, enabled: bool, resume_step: int = 0):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            # A resumed run rewrites the steps after its checkpoint: drop what the killed run logged past it.
            kept = [
                line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        except ImportError:  # tensorboard is optional
            self._tb = None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(clean, sort_keys=True) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, int | float) and key != "step":
                    self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
