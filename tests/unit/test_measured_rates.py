"""`bench plan`'s step time at the GPU suite's measured rate (issue #48, item 5): on an accelerator the
suite has run on, the measured step's MFU times its hardware-over-model FLOPs (full recompute: every
block's forward again, counted apart here from the blocks' share of the step); elsewhere, or where the
user sets bench.achievable_mfu, that; the plan prints which."""

from __future__ import annotations

import pytest

from vidforge.bench.plan import evaluate, format_plan
from vidforge.estimate.measured_rates import MEASURED, achievable_mfu
from vidforge.models.flops import forward_flops
from vidforge.profile import load_profile
from vidforge.profile.model import Model


def test_the_measured_rate_is_the_steps_mfu_with_its_recompute() -> None:
    step = MEASURED["h200"]
    count = forward_flops(Model.model_validate({"preset": step.preset}), [(21, 30, 52)], 512)
    # full recompute: the step's hardware FLOPs are its model FLOPs and the blocks' forward once more
    ratio = (count.train_step() + count.blocks) / count.train_step()
    assert 1.3 < ratio < 4 / 3
    for compiled, mfu in ((False, step.mfu_eager), (True, step.mfu_compiled)):
        profile = load_profile("dit1b_1xh200", [f"train.compile={str(compiled).lower()}"])
        rate, source = achievable_mfu(profile)
        assert rate == pytest.approx(mfu * ratio, rel=1e-3)
        assert source.startswith("measured") and "docs/gpu-runs" in source


def test_an_unmeasured_accelerator_or_a_set_rate_says_so_in_the_plan() -> None:
    h100 = load_profile("dit1b_1xh200", ["cluster.accelerator=h100", "train.activation_checkpointing=full"])
    assert achievable_mfu(h100) == (0.5, "assumed (bench.achievable_mfu; no GPU suite run on h100)")
    set_ = load_profile("dit1b_1xh200", ["bench.achievable_mfu=0.3"])
    assert achievable_mfu(set_) == (0.3, "bench.achievable_mfu as set")
    h200 = load_profile("dit1b_1xh200", ["train.activation_checkpointing=full"])
    plan = evaluate(h200)
    assert "step time's rate: measured" in format_plan(plan, h200)
    # the same step at 50% against the measured rate: the compute time scales by their ratio
    assumed = evaluate(
        load_profile("dit1b_1xh200", ["train.activation_checkpointing=full", "bench.achievable_mfu=0.5"])
    )
    assert plan.compute_s == pytest.approx(assumed.compute_s * 0.5 / achievable_mfu(h200)[0])
