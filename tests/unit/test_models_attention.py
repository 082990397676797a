"""Every attention backend agrees with a direct per-segment softmax computation, on CPU (and on a GPU
when one is at hand)."""

import importlib
import math
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend

from vidforge.attention.dispatch import (
    SDPA_BACKENDS,
    Attend,
    attention,
    flash_attn_available,
    say_fallback,
    sdpa_context,
    sdpa_kernels,
)
from vidforge.tokens import KeyPadding, Segments


def reference_attention(q, k, v, mask):
    """Softmax(q k^T / sqrt(d)) v computed segment by segment / row by row with plain matmuls, in
    float64: the keys a query may see are sliced out rather than masked."""
    q, k, v = q.double(), k.double(), v.double()

    def attend(qs, ks, vs):  # (S, H, D)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(qs.shape[-1])
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs)

    if mask is None:
        return torch.stack([attend(q[b], k[b], v[b]) for b in range(q.shape[0])])
    if isinstance(mask, KeyPadding):
        return torch.stack([attend(q[b], k[b, mask.mask[b]], v[b, mask.mask[b]]) for b in range(q.shape[0])])
    outs, qs, ks = [], 0, 0
    for ql, kl in zip(mask.q_lens, mask.kv_lens, strict=True):
        outs.append(attend(q[0, qs : qs + ql], k[0, ks : ks + kl], v[0, ks : ks + kl]))
        qs, ks = qs + ql, ks + kl
    return torch.cat(outs)[None]


def _cases(dtype, device="cpu"):
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)

    heads, dim = 2, 16
    padding = torch.tensor([[1] * 7 + [0] * 3, [1] * 10, [1] + [0] * 9], dtype=torch.bool, device=device)
    self_seg = Segments.self_attention([5, 9, 3, 3, 3, 1])  # includes a run of equal lengths
    cross_seg = Segments([5, 9, 4], [2, 7, 1])
    return {
        "full": (rand(2, 12, heads, dim), rand(2, 12, heads, dim), rand(2, 12, heads, dim), None),
        "key-padding": (
            rand(3, 6, heads, dim),
            rand(3, 10, heads, dim),
            rand(3, 10, heads, dim),
            KeyPadding(padding),
        ),
        "packed-self": (rand(1, 24, heads, dim), rand(1, 24, heads, dim), rand(1, 24, heads, dim), self_seg),
        "packed-cross": (
            rand(1, 18, heads, dim),
            rand(1, 10, heads, dim),
            rand(1, 10, heads, dim),
            cross_seg,
        ),
    }


CASES = ["full", "key-padding", "packed-self", "packed-cross"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["sdpa", "dense"])
def test_backend_matches_reference_float64(backend, case):
    q, k, v, mask = _cases(torch.float64)[case]
    torch.testing.assert_close(
        attention(q, k, v, mask, backend), reference_attention(q, k, v, mask), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("case", CASES)
def test_flex_forward_matches_reference_on_cpu(case):
    pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v, mask = _cases(torch.float32)[case]
    try:
        out = attention(q, k, v, mask, "flex")
    except (NotImplementedError, RuntimeError) as err:  # older torch: no CPU FlexAttention at all
        pytest.skip(f"FlexAttention does not run on CPU here: {err}")
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not flash_attn_available(), reason="flash-attn not installed or no GPU")
@pytest.mark.parametrize("case", CASES)
def test_flash_matches_reference(case):
    q, k, v, mask = _cases(torch.bfloat16, "cuda")[case]
    out = attention(q, k, v, mask, "flash")
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "backend,sdpa_backend",
    [
        ("sdpa", "auto"),
        ("sdpa", "cudnn"),
        ("sdpa", "flash"),
        ("sdpa", "efficient"),
        ("dense", "auto"),
        ("flex", "auto"),
    ],
)
def test_gpu_backends_match_reference_bf16(backend, sdpa_backend, case):
    q, k, v, mask = _cases(torch.bfloat16, "cuda")[case]
    out = attention(q, k, v, mask, backend, sdpa_backend)  # a forced flash falls back for a mask
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask), rtol=2e-2, atol=2e-2)


HOPPER, AMPERE, BLACKWELL = (9, 0), (8, 0), (10, 0)


def test_sdpa_kernel_choice_by_device_and_mask():
    """`auto` on Hopper: cuDNN first for unmasked calls (535 against flash's 322 TFLOP/s forward+backward
    at 32K tokens, measured on an H200); a key-padding mask never goes to flash, which takes none; off
    CUDA and off Hopper under `auto`, torch chooses."""
    for backend in SDPA_BACKENDS:
        assert sdpa_kernels(backend, None, masked=False) is None
        assert sdpa_kernels(backend, None, masked=True) is None
    assert sdpa_kernels("auto", HOPPER, masked=False) == ("cudnn", "flash", "efficient", "math")
    assert sdpa_kernels("auto", (9, 0), masked=False) == sdpa_kernels("auto", (9, 2), masked=False)
    assert sdpa_kernels("auto", AMPERE, masked=False) is None
    assert sdpa_kernels("auto", BLACKWELL, masked=False) is None
    for capability in (AMPERE, HOPPER, BLACKWELL):
        masked = sdpa_kernels("auto", capability, masked=True)
        assert masked[0] == "efficient" and "flash" not in masked
        assert sdpa_kernels("flash", capability, masked=True) == masked  # the per-call fallback
        assert sdpa_kernels("flash", capability, masked=False) == ("flash",)
        for kernel in ("cudnn", "efficient", "math"):  # forced kernels that take a mask keep it
            assert sdpa_kernels(kernel, capability, masked=True) == (kernel,)


def test_sdpa_context_sets_torch_s_kernels_and_says_a_fallback_once(monkeypatch):
    """What torch is told (its enabled kernels and their priority), and the fallback said once."""
    monkeypatch.setattr(importlib.import_module("vidforge.attention.dispatch"), "_said", set())
    with sdpa_context(sdpa_kernels("auto", HOPPER, masked=False)):
        assert torch._C._get_sdp_priority_order()[0] == SDPBackend.CUDNN_ATTENTION.value
        assert torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    default = torch._C._get_sdp_priority_order()
    assert default[0] != SDPBackend.CUDNN_ATTENTION.value  # restored (torch ranks cuDNN last)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(3):
            kernels = sdpa_kernels("flash", HOPPER, masked=True)
            say_fallback("flash", kernels)
            with sdpa_context(kernels):
                assert not torch.backends.cuda.flash_sdp_enabled()
                assert torch._C._get_sdp_priority_order()[0] == SDPBackend.EFFICIENT_ATTENTION.value
            kernels = sdpa_kernels("flash", HOPPER, masked=False)
            say_fallback("flash", kernels)
            with sdpa_context(kernels):
                assert torch.backends.cuda.flash_sdp_enabled()
                assert not torch.backends.cuda.mem_efficient_sdp_enabled()
    assert [str(w.message).split(":")[0] for w in said] == ["model.sdpa_backend=flash"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # `auto` has nothing to say, and a CPU nothing to fall back from
        say_fallback("auto", sdpa_kernels("auto", HOPPER, masked=True))
        say_fallback("flash", sdpa_kernels("flash", None, masked=True))


def test_the_kernel_choice_compiles_without_a_graph_break(monkeypatch):
    """torch.compile traces the choice, the note and the kernel context whole (dynamo's own counters):
    the note said from the function that made the context sent the whole frame back to eager."""
    monkeypatch.setattr(importlib.import_module("vidforge.attention.dispatch"), "_said", set())

    def call(q, sdpa_backend, masked):
        kernels = sdpa_kernels(sdpa_backend, HOPPER, masked)
        say_fallback(sdpa_backend, kernels)
        with sdpa_context(kernels):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q) * 2

    q = torch.randn(1, 2, 8, 16)
    for sdpa_backend, masked in [("auto", False), ("auto", True), ("flash", True), ("flash", False)]:
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            explained = torch._dynamo.explain(call)(q, sdpa_backend, masked)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), (sdpa_backend, masked)


def test_packed_sdpa_gradients_match_dense():
    """The per-run SDPA path and the block-diagonal mask give the same gradients (training on CPU)."""
    q0, k0, v0, mask = _cases(torch.float64)["packed-self"]
    grads = []
    for backend in ("sdpa", "dense"):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        (attention(q, k, v, mask, backend) * torch.arange(q.shape[-1], dtype=q.dtype)).sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_segments_group_equal_runs():
    seg = Segments.self_attention([5, 9, 3, 3, 3, 1])
    assert seg.runs() == [(0, 0, 1, 5, 5), (5, 5, 1, 9, 9), (14, 14, 3, 3, 3), (23, 23, 1, 1, 1)]


def test_bad_inputs_raise_value_errors():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="unknown backend"):
        attention(q, q, q, None, "magic")
    with pytest.raises(ValueError, match="packed Segments"):
        attention(q, q, q, Segments.self_attention([3]))
    with pytest.raises(ValueError, match="sdpa_backend"):
        Attend("sdpa", "fastest")
