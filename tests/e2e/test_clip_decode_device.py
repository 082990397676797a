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
from vidforge.curate.video.gpu_decode import decode_placement


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
    assert len(said) == 1 and said[0].startswith("curation.decode_device=cuda: ")  # no GPU, or no decoder
    assert "decoding on the CPU" not in cpu_out
    assert len(cpu_records) > 1 and [r["start_frame"] for r in cpu_records] == [
        r["start_frame"] for r in gpu_records
    ]
    assert gpu_records == cpu_records  # paths in the manifest are relative to its folder
    assert gpu_files == cpu_files and len(gpu_files) == len(gpu_records)


def test_auto_says_nothing_without_the_decoder_or_a_gpu_and_cuda_names_what_is_missing(monkeypatch):
    import vidforge.curate.video.gpu_decode as gd

    monkeypatch.setattr(gd, "find_spec", lambda name: None)
    assert decode_placement("auto") == ("cpu", None) and decode_placement("cpu") == ("cpu", None)
    device, why = decode_placement("cuda")
    assert device == "cpu" and "PyNvVideoCodec is not installed" in why and "\n" not in why
    monkeypatch.setattr(gd, "find_spec", lambda name: object())  # the decoder is there, no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert decode_placement("auto") == ("cpu", None)
    assert decode_placement("cuda") == (
        "cpu",
        "curation.decode_device=cuda: no GPU is visible; decoding on the CPU",
    )


def test_the_decode_workers_start_without_torch():
    """Deciding the decode device costs a CPU run nothing: decode.py and transcode.py (what the
    forkserver imports before the first worker) do not import torch (~4 s of start-up here)."""
    import subprocess
    import sys

    code = "import sys, vidforge.curate.clipping.decode, vidforge.curate.clipping.transcode; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
