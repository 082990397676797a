"""The LAION aesthetic predictor: an MLP on L2-normalised CLIP ViT-L/14 image embeddings that scores
images about 1 to 10 (christophschuhmann/improved-aesthetic-predictor). Same module layout and key
names (`layers.0`, `layers.2`, `layers.4`, `layers.6`, `layers.7`), so LAION's published `.pth` state
dict (e.g. `sac+logos+ava1-l14-linearMSE.pth`) loads as it is. A clip's score is the mean over frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from vidforge.errors import UserInputError
from vidforge.weights_file import load_torch_weights


class AestheticHead(nn.Module):
    """768 -> 1024 -> 128 -> 64 -> 16 -> 1, with dropouts (identity at inference)."""

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def load_head(
    path: str | None, *, random_weights: bool = False, device: str = "cpu"
) -> tuple[AestheticHead, bool]:
    """The head with weights from `path` (.pth/.pt state dict, or .safetensors). Without a path: random
    weights if allowed (returns True as the second value), else a UserInputError saying what to set."""
    if path is None:
        if not random_weights:
            raise UserInputError(
                "curation.caption.aesthetic.head: give the local LAION aesthetic head (e.g. "
                "sac+logos+ava1-l14-linearMSE.pth), set curation.caption.aesthetic.enabled=false, or "
                "curation.caption.random_weights=true (tests and demos only)"
            )
        torch.manual_seed(0)
        return AestheticHead().to(device).eval(), True
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"curation.caption.aesthetic.head: no such file {file}")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(file))
    else:
        state = load_torch_weights(file, "curation.caption.aesthetic.head")
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
    first = state.get("layers.0.weight")
    if first is None:
        raise UserInputError(
            f"curation.caption.aesthetic.head: {file} is not a LAION aesthetic head (no layers.0.weight)"
        )
    head = AestheticHead(input_size=int(first.shape[1]))
    head.load_state_dict(state)
    return head.to(device).eval(), False


class AestheticScorer:
    """Scores unit-length CLIP image embeddings; a clip's score is the mean over its frames."""

    def __init__(self, head_path: str | None, *, device: str = "cpu", random_weights: bool = False):
        self.head_path, self.device, self.random_allowed = head_path, device, random_weights
        self.head: AestheticHead | None = None
        self.random_weights = False

    def setup(self, embedding_width: int | None = None) -> None:
        if self.head is None:
            self.head, self.random_weights = load_head(
                self.head_path, random_weights=self.random_allowed, device=self.device
            )
        if embedding_width is not None and embedding_width != self.head.input_size:
            raise UserInputError(
                f"curation.caption.aesthetic.head expects {self.head.input_size}-wide CLIP embeddings but "
                f"curation.caption.clip.model gives {embedding_width}; use ViT-L-14 for the LAION head"
            )

    @torch.no_grad()
    def score_frames(self, embeddings: np.ndarray) -> np.ndarray:
        """(N, D) unit-length embeddings -> (N,) scores."""
        self.setup()
        assert self.head is not None
        x = torch.as_tensor(embeddings, dtype=torch.float32, device=self.device)
        return self.head(x).squeeze(-1).cpu().numpy()

    def score_clip(self, embeddings: np.ndarray) -> float:
        return float(np.mean(self.score_frames(embeddings))) if len(embeddings) else float("nan")
