"""NVDEC decoding (curation.decode_device=cuda, gpu_decode.py) against PyAV on the CPU: the same
frames at detection size within a few grey levels (two YUV->RGB conversions and resizers), and the
same shots on the sample videos."""

from __future__ import annotations

import numpy as np
import pytest

from vidforge.curate.clipping.decode import analyse
from vidforge.curate.video.gpu_decode import decode_placement, gpu_frames
from vidforge.profile import load_profile

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _decoder():
    pytest.importorskip("PyNvVideoCodec", reason="the gpu-decode extra (PyNvVideoCodec) is not installed")


def test_nvdec_frames_match_pyav_at_detection_size(sample_videos):
    from vidforge.curate.clipping.decode import _cpu_pictures
    from vidforge.curate.video.container import open_source, video_stream

    source = str(sample_videos / "cuts.mp4")
    with open_source(source) as container:
        cpu = [bgr for _, _, bgr in _cpu_pictures(container, video_stream(container))]
    size = (cpu[0].shape[1], cpu[0].shape[0])
    gpu = list(gpu_frames(source, size))
    assert len(gpu) == len(cpu)
    diff = np.abs(np.stack(gpu).astype(np.int16) - np.stack(cpu).astype(np.int16))
    assert diff.mean() < 3.0, diff.mean()


@pytest.mark.parametrize("name", ["cuts", "false_split"])
def test_nvdec_analysis_finds_the_cpu_shots(sample_videos, name):
    assert decode_placement("cuda") == ("cuda", None)
    source = str(sample_videos / f"{name}.mp4")
    shots = {}
    for device in ("cpu", "cuda"):
        cfg = load_profile(None, []).curation
        a = analyse(source, cfg, gpu=device == "cuda")
        shots[device] = ([(s.start, s.end) for s in a.shots], a.pts.tolist(), a.static.mean())
    assert shots["cuda"][:2] == shots["cpu"][:2]
    assert abs(shots["cuda"][2] - shots["cpu"][2]) < 0.05
