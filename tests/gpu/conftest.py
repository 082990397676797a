"""The `device` fixture of the `gpu` tests (gpu_device.DEVICE)."""

from __future__ import annotations

import pytest
import torch
from gpu_device import DEVICE


@pytest.fixture
def device() -> torch.device:
    return DEVICE
