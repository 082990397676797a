"""Decoding a source on the GPU (NVDEC through PyNvVideoCodec, the `gpu-decode` extra) for the analysis
of clipping/decode.py: frames come out as RGB on the device, are downscaled there to PySceneDetect's detection
size in batches, and only that small copy crosses to the host. `curation.decode_device` chooses; where
no GPU or no decoder is there, the CPU decodes (PyAV) and the run says why in one line.

PyNvVideoCodec rather than torchcodec: torchcodec's PyPI wheel is CPU-only (its CUDA builds live on
PyTorch's own index) and needs a system FFmpeg; PyNvVideoCodec's PyPI wheel carries NVDEC support for
CPython 3.12 on manylinux_2_28, which the GPU image is."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec

import numpy as np

from vidforge.curate.video.container import open_source, video_stream
from vidforge.errors import UserInputError

BATCH = 32  # frames decoded and downscaled per call: enough to keep NVDEC busy, a few MB of 720p RGB


def decode_placement(choice: str) -> tuple[str, str | None]:
    """(`cuda` or `cpu`, why the CPU decodes although the profile asked for the GPU, or None): `auto` is
    the GPU when the decoder is installed and a GPU is visible, else the CPU with nothing to say; `cuda`
    without either falls back with the reason, which the run prints once. Decided once in the driver:
    without the decoder, torch is not imported (the decode workers start without it)."""
    if choice == "cpu":
        return "cpu", None
    if find_spec("PyNvVideoCodec") is None:
        why = "PyNvVideoCodec is not installed (pip install 'vidforge[gpu-decode]')"
        return "cpu", f"curation.decode_device=cuda: {why}; decoding on the CPU" if choice == "cuda" else None
    from vidforge.device import select_device

    try:
        device = select_device(choice, "curation.decode_device")
    except UserInputError:
        return "cpu", "curation.decode_device=cuda: no GPU is visible; decoding on the CPU"
    return ("cuda", None) if device.type == "cuda" else ("cpu", None)


def presentation_pts(source: str) -> list[int]:
    """The video stream's frame timestamps in presentation order, from the packets alone (no decode):
    NVDEC hands frames out in that order without their timestamps."""
    with open_source(source) as container:
        stream = video_stream(container)
        return sorted(p.pts for p in container.demux(stream) if p.pts is not None and p.size)


def gpu_frames(source: str, size: tuple[int, int], device: int = 0) -> Iterator[np.ndarray]:
    """The source's frames in presentation order as BGR uint8 arrays of `size` (width, height), decoded
    and resized (bilinear, as cv2's INTER_LINEAR in shots.downscale) on GPU `device`."""
    import PyNvVideoCodec as nvc
    import torch
    import torch.nn.functional as F

    decoder = nvc.SimpleDecoder(
        source, gpu_id=device, use_device_memory=True, output_color_type=nvc.OutputColorType.RGB
    )
    width, height = size
    while True:
        frames = decoder.get_batch_frames(BATCH)
        if not frames:
            return
        rgb = torch.stack([torch.from_dlpack(f) for f in frames])  # N x H x W x 3 uint8 on the GPU
        batch = rgb.permute(0, 3, 1, 2).float()
        if batch.shape[-2:] != (height, width):
            batch = F.interpolate(batch, size=(height, width), mode="bilinear", align_corners=False)
        bgr = batch.round().clamp(0, 255).to(torch.uint8).flip(1).permute(0, 2, 3, 1).contiguous().cpu()
        yield from bgr.numpy()
