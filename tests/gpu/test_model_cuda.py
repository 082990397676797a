"""The DiT on the device: bf16 autocast and packed rows against float32/float64 on the CPU, and
torch.compile of the model against the same model eager."""

from __future__ import annotations

import pytest
import torch
from gpu_device import rel_error

from vidforge.models import SequenceLayout, build_model, model_config, pack_latents

pytestmark = pytest.mark.gpu


def _model(dtype=torch.float32):
    cfg = model_config("tiny", adaln_lora_rank=8, mlp_act="swiglu", layers=2)
    torch.manual_seed(0)
    model = build_model(cfg, dtype=dtype).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the adaLN-zero start, so every parameter reaches the output
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _batch(dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 3, 8, 8, generator=g, dtype=dtype)
    noise = torch.randn(2, generator=g, dtype=dtype)
    text = torch.randn(2, 6, 32, generator=g, dtype=dtype)
    mask = torch.tensor([[1] * 6, [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    return x, noise, text, mask


def _to(device, *tensors):
    return [t.to(device) for t in tensors]


def test_bf16_autocast_forward_matches_float32_on_the_cpu(device):
    model = _model()
    batch = _batch()
    with torch.no_grad():
        ref = model(*batch)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = model.to(device)(*_to(device, *batch))
    assert out.dtype in (torch.bfloat16, torch.float32)
    assert rel_error(out, ref) < 3e-2


def test_packed_row_matches_float64_on_the_cpu(device):
    model = _model(torch.float64)
    g = torch.Generator().manual_seed(3)
    latents = [torch.randn(4, t, 4, 6, generator=g, dtype=torch.float64) for t in (1, 2, 3)]
    tokens, layout = pack_latents(latents, model.config.patch)
    assert isinstance(layout, SequenceLayout)
    noise = torch.randn(3, generator=g, dtype=torch.float64)
    text = torch.randn(3, 5, 32, generator=g, dtype=torch.float64)
    with torch.no_grad():
        ref = model(tokens, noise, text, layout=layout)
        out = model.float().to(device)(
            *_to(device, tokens.float(), noise.float(), text.float()), layout=layout
        )
    assert rel_error(out, ref) < 1e-4


def test_compiled_model_matches_eager(device):
    if device.type == "cpu":
        pytest.skip("inductor's C++ build of the model takes minutes on a CPU")
    model = _model().to(device)
    batch = _to(device, *_batch())
    with torch.no_grad():
        eager = model(*batch)
        compiled = torch.compile(model)(*batch)
    assert rel_error(compiled, eager) < 1e-3


@pytest.mark.parametrize("family", ["vidforge", "wan"])
def test_a_seed_builds_the_cpu_s_weights_on_the_device(device, family):
    """The initialisation is drawn on the CPU whatever the device (a CUDA generator draws another stream),
    and leaves the CPU generator, which the training noise comes from, where the CPU build leaves it."""
    cfg = model_config("tiny", layers=2, family=family)
    built = {}
    for where in ("cpu", device):
        torch.manual_seed(0)
        weights = build_model(cfg, device=where).state_dict()
        built[str(where)] = (weights, torch.get_rng_state())
    (ref, ref_state), (ours, state) = built["cpu"], built[str(device)]
    assert torch.equal(state, ref_state)
    for name, value in ref.items():
        assert ours[name].device.type == device.type
        torch.testing.assert_close(ours[name].cpu(), value, rtol=0, atol=0, msg=name)
