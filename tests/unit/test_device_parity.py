"""What makes a training run on a GPU the CPU's run: its TF32 setting decided by train.precision
(`vidforge.train.build.use_tf32`), and initial weights that do not depend on the device they are built on
(`vidforge.models.cpu_draws`; the loss's draws: test_train_objectives):
every random draw of the initialisation comes from torch's CPU generator and is copied to the device.
A CPU machine has no second device that holds values, so the redirection is checked from both sides:
building on the meta device (no values) with the redirection on consumes the CPU generator exactly as a
CPU build does, and a CPU build with every draw redirected (drawn apart, then copied) gives the CPU
build's weights bit for bit."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import WAN, train_profile  # noqa: E402

from vidforge.models import build_model, count_parameters, model_config  # noqa: E402
from vidforge.models.cpu_draws import MAX_PARAMETERS, CpuDraws, cpu_draws  # noqa: E402


def _built(profile, device: str, redirect: tuple[str, ...] | None) -> tuple[dict, torch.Tensor]:
    torch.manual_seed(0)
    with CpuDraws(passthrough=redirect) if redirect is not None else nullcontext():
        model = build_model(profile.model, device=device)
    return model.state_dict(), torch.get_rng_state()


@pytest.mark.parametrize("family", ["vidforge", "wan"])
def test_the_initial_weights_are_drawn_on_the_cpu_whatever_the_device(family) -> None:
    profile = train_profile(*(WAN if family == "wan" else ()))
    weights, state = _built(profile, "cpu", None)
    # the draws for a device other than the CPU come from the CPU generator, in the CPU build's order
    on_meta, meta_state = _built(profile, "meta", redirect=("cpu",))
    assert torch.equal(meta_state, state)
    assert all(t.device.type == "meta" for t in on_meta.values())
    # drawn on the side and copied into the weights: the CPU build's values
    copied, copied_state = _built(profile, "cpu", redirect=())
    assert torch.equal(copied_state, state)
    assert weights.keys() == copied.keys()
    for name, value in weights.items():
        assert torch.equal(copied[name], value), name
    # without the redirection a meta build draws nothing: what a CUDA build did to the CPU generator
    torch.manual_seed(0)
    fresh = torch.get_rng_state()
    assert torch.equal(_built(profile, "meta", None)[1], fresh) and not torch.equal(state, fresh)


def test_a_gpu_build_redirects_its_draws_and_a_cpu_build_needs_no_redirection() -> None:
    """Redirected: a GPU build of a model a CPU can train (the tiny ones the GPU suite compares with the
    CPU); not: a CPU or meta build, nor the 1.3B Wan (seconds of serial CPU draws per build)."""
    tiny = count_parameters(train_profile().model)
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        mode = cpu_draws(device, lambda: tiny)
        assert isinstance(mode, CpuDraws) and "cuda" not in mode.passthrough
    for device in ("cpu", "meta", None):
        assert not isinstance(cpu_draws(device, lambda: tiny), CpuDraws)
    wan = count_parameters(model_config("wan2.1-1.3b"))
    assert tiny < MAX_PARAMETERS < wan
    assert not isinstance(cpu_draws("cuda", lambda: wan), CpuDraws)


def test_an_explicit_generator_is_kept() -> None:
    g = torch.Generator().manual_seed(3)
    with CpuDraws(passthrough=()):
        drawn = torch.randn(4, generator=g)
    assert torch.equal(drawn, torch.randn(4, generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize(("precision", "tf32"), [("fp32", False), ("bf16", True)])
def test_tf32_is_decided_by_the_run_s_precision(precision, tf32) -> None:
    from vidforge.parallel.runtime import init_runtime
    from vidforge.train.build import build

    flags = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = [flag.allow_tf32 for flag in flags]
    try:
        for flag in flags:
            flag.allow_tf32 = not tf32
        profile = train_profile(f"train.precision={precision}")
        build(profile, init_runtime(profile))
        assert [flag.allow_tf32 for flag in flags] == [tf32, tf32]
    finally:
        for flag, value in zip(flags, saved, strict=True):
            flag.allow_tf32 = value
