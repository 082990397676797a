"""`curation.decode_device`: where no GPU (or no NVDEC decoder) is there, `cuda` falls back to the CPU
with one line saying why, and the run gives the same clips, byte for byte, as `cpu` (on a GPU machine
the NVDEC path itself is tests/gpu/test_gpu_decode_cuda.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from curation_fixtures import CLIP_OPEN_SETS
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.curate.gpu_decode import decode_placement


def _clip(source: Path, out: Path, device: str):
    sets = [*CLIP_OPEN_SETS, "curation.min_seconds=0", f"curation.decode_device={device}"]
    result = CliRunner().invoke(
        app, ["clip", str(source), "-o", str(out), *[x for s in sets for x in ("--set", s)]]
    )
    assert result.exit_code == 0, result.output
    records = (out / "manifest.jsonl").read_text().splitlines()
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "clips").glob("*.mp4")}
    return result.output, [json.loads(r) for r in records], files


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for a machine without a GPU")
def test_cuda_without_a_gpu_decodes_on_the_cpu_in_one_line_with_the_same_clips(tmp_path, sample_videos):
    source = sample_videos / "cuts.mp4"
    cpu_out, cpu_records, cpu_files = _clip(source, tmp_path / "cpu", "cpu")
    gpu_out, gpu_records, gpu_files = _clip(source, tmp_path / "cuda", "cuda")
    said = [line for line in gpu_out.splitlines() if "decoding on the CPU" in line]
    assert said == ["curation.decode_device=cuda: no GPU is visible; decoding on the CPU"]
    assert "decoding on the CPU" not in cpu_out
    assert len(cpu_records) > 1 and [r["start_frame"] for r in cpu_records] == [
        r["start_frame"] for r in gpu_records
    ]
    assert gpu_records == cpu_records  # paths in the manifest are relative to its folder
    assert gpu_files == cpu_files and len(gpu_files) == len(gpu_records)


def test_auto_without_a_gpu_says_nothing_and_a_missing_decoder_is_named(monkeypatch):
    import vidforge.curate.gpu_decode as gd

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert decode_placement("auto") == ("cpu", None)
    assert decode_placement("cpu") == ("cpu", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gd, "find_spec", lambda name: None)
    device, why = decode_placement("auto")
    assert device == "cpu" and "PyNvVideoCodec is not installed" in why and "\n" not in why
