"""`tokenize finetune` under FSDP2 on 2 gloo ranks (one clip each per step) against one process (two
clips per step): the same logged losses, held-out measures and saved VAE. About 35 s here, beyond the
suite's budget for this piece: an opt-in extra with VIDFORGE_TEST_ALL_LAYOUTS=1 (one more layout)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from ranks import run_ranks  # noqa: E402
from test_tokenizer_finetune import finetune_profile, save_tiny_wan, write_clips  # noqa: E402

from vidforge.train.metrics import read_metrics  # noqa: E402
from vidforge.train.tokenizer_finetune import run  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.skipif(
        os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") != "1", reason="opt-in: VIDFORGE_TEST_ALL_LAYOUTS=1"
    ),
]

LR = 2e-3  # the profile's tokenizer.finetune.lr
SETTINGS = (
    "tokenizer.finetune.steps=3",
    "tokenizer.finetune.gan_start=1",
    "tokenizer.finetune.lpips_weight=0.1",
)


def _finetune(wan_dir: Path, clips: Path, run_dir: Path, batch: int) -> list[dict]:
    run(finetune_profile(wan_dir, *SETTINGS, f"tokenizer.finetune.batch={batch}"), clips, run_dir)
    return read_metrics(run_dir / "metrics.jsonl")


def _worker(rank: int, world: int, wan_dir: Path, clips: Path, run_dir: Path) -> list[dict]:
    records = _finetune(wan_dir, clips, run_dir, batch=1)
    return records if rank == 0 else []  # rank 0 writes the metrics


def test_two_rank_fsdp2_equals_one_process(tmp_path):
    from diffusers import AutoencoderKLWan

    wan_dir, clips = save_tiny_wan(tmp_path / "wan"), write_clips(tmp_path / "clips", count=5)
    two = run_ranks(_worker, 2, wan_dir, clips, tmp_path / "two")[0]
    one = _finetune(wan_dir, clips, tmp_path / "one", batch=2)
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for a, b in zip(two, one, strict=True):
        assert set(a) == set(b)
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    # The saved weights: AdamW moves an element whose gradient is rounding noise by up to lr per step in
    # either direction (the reduction order differs between the layouts), so a few elements may differ
    # by lr-sized amounts (attention key biases, whose true gradient is 0, are such); a wrong split or a
    # missing gradient reduction moves most of them.
    sharded = AutoencoderKLWan.from_pretrained(tmp_path / "two" / "vae").state_dict()
    moved = total = 0
    for name, tensor in AutoencoderKLWan.from_pretrained(tmp_path / "one" / "vae").state_dict().items():
        diff = (sharded[name] - tensor).abs()
        assert float(diff.max()) <= 3 * 2 * LR, (name, float(diff.max()))
        moved, total = moved + int((diff > 1e-5).sum()), total + diff.numel()
    assert moved < 0.01 * total, (moved, total)
