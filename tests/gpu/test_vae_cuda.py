"""The VAE encode on the device against the same weights on the CPU (a tiny random Wan VAE saved in
diffusers' format, loaded by vidforge's tokenizer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gpu_device import rel_error

from vidforge.tokenizers.vae import DiffusersVAE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_tokenizers_vae import TINY_WAN  # noqa: E402  (the tiny Wan VAE config of the CPU tests)

pytestmark = pytest.mark.gpu


def test_vae_encode_on_the_device_matches_the_cpu(tmp_path, device):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    AutoencoderKLWan(**TINY_WAN).save_pretrained(tmp_path / "wan")
    x = torch.rand(1, 3, 9, 32, 48, generator=torch.Generator().manual_seed(1)) * 2 - 1
    ref = DiffusersVAE("wan", path=str(tmp_path / "wan")).encode(x)
    out = DiffusersVAE("wan", path=str(tmp_path / "wan"), device=device).encode(x.to(device))
    assert out.shape == ref.shape == (1, 4, 3, 4, 6)
    assert rel_error(out, ref) < 1e-3
