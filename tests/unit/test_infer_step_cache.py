"""Step caching (`infer.cache`, TeaCache's rule): off it changes nothing, on it skips model calls and
stays close to the uncached sample, each guidance branch reuses its own residual, and `vidforge infer`
reports the calls it skipped."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vidforge.errors import UserInputError
from vidforge.models import build_model, model_config
from vidforge.profile import load_profile
from vidforge.sampling.latents import sample_latents
from vidforge.sampling.step_cache import WAN21_COEFFICIENTS, StepCache, installed, rescale_name
from vidforge.weights.checkpoint import save_model

SHAPE = (4, 3, 4, 4)  # the tiny preset's latents: 48 tokens


def _tiny(family: str = "vidforge", cfg=None, **sets):
    """A tiny model moved off its zero-initialised gates, so the blocks' residual is not zero."""
    torch.manual_seed(0)
    cfg = (cfg or model_config("tiny")).model_copy(update={"family": family, **sets})
    model = build_model(cfg, dtype=torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _sample(model, cache=None, *sets):
    profile = load_profile("local_cpu", ["diffusion.steps=12", *sets])
    text = torch.randn(2, 3, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 3, dtype=torch.bool)
    return sample_latents(model, profile, text, mask, [0, 1], SHAPE, cache=cache)


def test_threshold_zero_is_bitwise_the_uncached_sample_and_counts_every_call() -> None:
    model = _tiny()
    cache = StepCache(0.0)
    assert torch.equal(_sample(model, cache), _sample(model))
    assert (cache.calls, cache.skipped) == (2 * 12 - 1, 0)  # Heun: 2N - 1 guided calls for N steps
    assert model.step_cache is None  # uninstalled after sampling


def test_a_threshold_skips_calls_and_stays_close_to_the_uncached_sample() -> None:
    model = _tiny()
    reference = _sample(model)
    cache = StepCache(0.1)
    cached = _sample(model, cache)
    assert cache.calls == 23 and 0 < cache.skipped < cache.calls
    # the bound: within 3% of the uncached latents' norm (measured: 1.0% with 16 of 23 calls skipped;
    # 0.01% with 9 skipped at threshold 0.02, 4.0% with 20 at 0.4)
    error = (cached - reference).norm() / reference.norm()
    assert 0 < error < 0.03, (error, cache.skipped)


def test_the_guidance_branches_reuse_their_own_residuals() -> None:
    """One decision for the batched [cond; uncond] call, but the skipped call's conditional rows are
    what a conditional-only run gives, and its unconditional rows an unconditional-only run's."""
    model = _tiny()
    x = torch.randn(2, *SHAPE, dtype=torch.float64)
    text = torch.randn(2, 3, 32, dtype=torch.float64)

    def two_calls(rows: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
        cache = StepCache(1e9)  # skips every call after the first
        with installed(model, cache):
            for level in (0.5, 0.45):
                out = model(
                    rows,
                    torch.full((len(rows),), level, dtype=torch.float64),
                    text[: len(rows)].repeat(len(rows) // 2, 1, 1),
                    drop_text=drop,
                )
        assert (cache.calls, cache.skipped) == (2, 1)
        return out

    both = two_calls(torch.cat([x, x]), torch.tensor([False, False, True, True]))
    cond = two_calls(x, torch.tensor([False, False]))
    uncond = two_calls(x, torch.tensor([True, True]))
    torch.testing.assert_close(both[:2], cond)
    torch.testing.assert_close(both[2:], uncond)
    assert not torch.allclose(cond, uncond)


def test_wan_gets_teacaches_fit_by_size_and_other_families_the_identity() -> None:
    tiny = model_config("tiny")
    wan = tiny.model_copy(update={"family": "wan"})
    assert rescale_name("auto", tiny) == "identity"
    assert rescale_name("auto", wan.model_copy(update={"hidden": 1536, "layers": 30})) == "wan2.1-t2v-1.3b"
    assert rescale_name("auto", wan.model_copy(update={"hidden": 5120, "layers": 40})) == "wan2.1-t2v-14b"
    assert rescale_name("auto", wan) == "identity"  # a size TeaCache did not fit
    with pytest.raises(UserInputError, match=r"^infer.cache.rescale: wan2.1-t2v-14b was fitted on Wan2.1"):
        rescale_name("wan2.1-t2v-14b", tiny)


def test_a_wan_fit_rescales_the_timestep_embeddings_change_by_teacaches_polynomial() -> None:
    """The Wan fit's indicator is Wan's temb (what TeaCache fitted on), its change mapped through the
    polynomial as numpy.poly1d evaluates it (TeaCache's own call)."""
    model = _tiny("wan", mlp_act="gelu-tanh", adaln_lora_rank=0, abs_position="none", cross_attn_norm=True)
    cache = StepCache(0.1, "wan2.1-t2v-1.3b")
    seen = []
    with installed(model, cache), torch.no_grad():
        cache.indicator = lambda m, h, cond: seen.append(cond.time) or StepCache.indicator(cache, m, h, cond)
        x, text = torch.randn(1, *SHAPE, dtype=torch.float64), torch.randn(1, 3, 32, dtype=torch.float64)
        for level in (900.0, 880.0):
            model(x, torch.tensor([level], dtype=torch.float64), text)
    before, now = seen
    rel = float((now - before).abs().mean() / before.abs().mean())
    expected = np.poly1d(WAN21_COEFFICIENTS["wan2.1-t2v-1.3b"])(rel)
    assert cache.change(now, before) == pytest.approx(expected, rel=1e-12)


def test_infer_reports_the_skipped_calls(tmp_path) -> None:
    from vidforge.infer import run as infer_run

    sets = [
        "model.hidden=64",
        "model.mlp_hidden=256",
        "diffusion.steps=6",
        "infer.frames=9",
        "infer.height=16",
        "infer.width=16",
        "infer.cache.threshold=0.2",
    ]
    model = _tiny(cfg=load_profile("local_cpu", sets).model)
    export = save_model(model.float(), tmp_path / "export")
    result = infer_run.run(
        export, ["a red square", "a cat"], tmp_path / "out", overrides=sets, profile="local_cpu"
    )
    assert result.model_calls == 11 and 0 < result.skipped_calls < 11
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [(r["model_calls"], r["skipped_calls"]) for r in records] == [(11, result.skipped_calls)] * 2
    assert records[0]["cache_threshold"] == 0.2
