"""Every attention backend vidforge dispatches to, on the device in bf16, against the dense reference
in float64 on the CPU: plain batches, padded captions (KeyPadding) and packed rows (Segments), forward
and backward; and which SDPA kernel `model.sdpa_backend=auto` runs for each (the profiler's op names)."""

from __future__ import annotations

import pytest
import torch
from gpu_device import rel_error

from vidforge.attention.dispatch import attention, flash_attn_available, sdpa_kernels
from vidforge.tokens import KeyPadding, Segments

pytestmark = pytest.mark.gpu

BACKENDS = [("sdpa", "cudnn"), ("sdpa", "flash"), ("sdpa", "efficient"), ("flex", "auto"), ("flash", "auto")]
HEADS, DIM = 4, 64


def _case(kind: str):
    g = torch.Generator().manual_seed(0)
    if kind == "packed":
        lens = (40, 40, 88, 17)
        shape_q = shape_kv = (1, sum(lens), HEADS, DIM)
        mask = Segments.self_attention(lens)
    elif kind == "padding":
        shape_q, shape_kv = (2, 96, HEADS, DIM), (2, 24, HEADS, DIM)
        valid = torch.arange(24)[None] < torch.tensor([[24], [5]])
        mask = KeyPadding(valid)
    else:
        shape_q = shape_kv = (2, 128, HEADS, DIM)
        mask = None
    q = torch.randn(shape_q, generator=g, dtype=torch.float64)
    k, v = (torch.randn(shape_kv, generator=g, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(shape_q, generator=g, dtype=torch.float64)
    return q, k, v, grad, mask


def _on(mask, device):
    return KeyPadding(mask.mask.to(device)) if isinstance(mask, KeyPadding) else mask


@pytest.mark.parametrize("kind", ["plain", "padding", "packed"])
@pytest.mark.parametrize(("backend", "kernel"), BACKENDS, ids=[f"{b}-{k}" for b, k in BACKENDS])
def test_backend_matches_the_float64_reference(device, backend, kernel, kind):
    if backend == "flash" and not flash_attn_available():
        pytest.skip("flash-attn is not installed on this machine")
    q, k, v, grad, mask = _case(kind)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = attention(*leaves, mask, "dense")
    ref.backward(grad)

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    # FlexAttention has no CPU backward (and refuses inputs that need a gradient there)
    backward = not (backend == "flex" and device.type == "cpu")
    ours = [t.detach().to(device, dtype).requires_grad_(backward) for t in (q, k, v)]
    out = attention(*ours, _on(mask, device), backend, kernel)
    assert rel_error(out, ref) < 2e-2
    if not backward:
        return
    out.backward(grad.to(device, dtype))
    for mine, theirs in zip(ours, leaves, strict=True):
        assert rel_error(mine.grad, theirs.grad) < 3e-2


# the aten op each SDPA kernel runs as (what the profiler records)
KERNEL_OPS = {
    "cudnn": "aten::_scaled_dot_product_cudnn_attention",
    "flash": "aten::_scaled_dot_product_flash_attention",
    "efficient": "aten::_scaled_dot_product_efficient_attention",
    "math": "aten::_scaled_dot_product_attention_math",
}


@pytest.mark.parametrize("kind", ["plain", "padding", "packed"])
def test_auto_runs_the_kernel_the_dispatcher_chose(device, kind):
    """On Hopper: cuDNN for unmasked calls (plain, and the packed row's per-run calls), the memory-efficient
    kernel for a key-padding mask; elsewhere torch's own order (flash, then efficient for a mask)."""
    if device.type != "cuda":
        pytest.skip("SDPA kernels are CUDA's")
    from torch.profiler import ProfilerActivity, profile

    q, k, v, grad, mask = _case(kind)
    q, k, v = (t.to(device, torch.bfloat16).requires_grad_() for t in (q, k, v))
    masked = kind == "padding"
    chosen = sdpa_kernels("auto", torch.cuda.get_device_capability(device), masked)
    expected = chosen[0] if chosen else ("efficient" if masked else "flash")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        attention(q, k, v, _on(mask, device), "sdpa", "auto").backward(grad.to(device, torch.bfloat16))
        torch.cuda.synchronize(device)
    names = {event.name for event in prof.events()}
    ran = {kernel for kernel, op in KERNEL_OPS.items() if op in names}
    assert ran == {expected}, sorted(n for n in names if "attention" in n)
