"""HunyuanVideo-1.5 and LTX-2 (the video path) under their tensor-parallel plans (`families/hunyuan15/
tensor_parallel.py`, `families/ltx2/tensor_parallel.py`) on 2 gloo ranks against one process, at the
module level: every rank builds the same tiny float64 network (test_family_cp.py's) and plain batch,
takes one process's output, loss, gradients and the weights after one SGD step as the reference, then
runs the same on a tensor-parallel copy (gradients and weights as `full_tensor()`, partial gradients
reduced first, as the trainer does).

The cases cover what each plan has to get right: HunyuanVideo-1.5 image-to-video (joint attention over
[video, image, caption], both streams' projections and feed-forwards split, per-head q/k norms whose
replicated weights get a gradient from each rank's heads); LTX-2.3's block (gated attention: one gate per
head, prompt modulation) with "split" RoPE (a table per head: a rank takes its heads' rows) and with
"interleaved" RoPE (a table per feature: a rank takes its columns), its q/k RMSNorm across all heads
(statistics all-reduced), each with sequence parallel too (24 tokens: the stream split over the ranks,
the modulation table's gradient summed over them). A rank rotating with another rank's angles, a norm over
a rank's share alone or a missing gradient reduction is O(1e-2) off. Tolerance float32-sized (1e-5, as the
Wan plan's test): the heads-spanning norm and both families' rotations compute in float32 whatever the
dtype. Also: the memory model's per-rank parameters (`tp_rules`) equal what the plans leave on a rank, and
LTX-2's SP refuses a noise level per token. The same plans under `vidforge train` (three AdamW steps, the
exported weights) are test_family_train_layouts.py's opt-in tp2 layouts."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402
from test_family_cp import SHAPE, _hunyuan15, _ltx2  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TOL = 1e-5
SP_SHAPE = (2, 3, 4)  # 24 tokens: sequence parallel splits the row evenly over 2 ranks
# name -> (sequence parallel, latent shape)
CASES = {
    "hunyuan15-i2v": (False, SHAPE),
    "ltx2-split": (False, SHAPE),
    "ltx2-interleaved": (False, SHAPE),
    "ltx2-interleaved-sp": (True, SP_SHAPE),
    "ltx2-split-sp": (True, SP_SHAPE),
}


def _build(case: str):
    """The network (test_family_cp's) and a plain batch of 2 at the case's shape: noisy tokens, target, noise
    level, caption
    (sample 1's padded) and for I2V the condition tokens and image embedding."""
    model = _hunyuan15() if case.startswith("hunyuan15") else _ltx2(case.split("-")[1])
    cfg, shape = model.config, CASES[case][1]
    tokens = shape[0] * shape[1] * shape[2]
    g = torch.Generator().manual_seed(2)

    def draw(*size):
        return torch.randn(*size, generator=g, dtype=torch.float64)

    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    level = torch.rand(2, generator=g, dtype=torch.float64)
    inp = {"x": draw(2, tokens, cfg.in_channels), "target": draw(2, tokens, cfg.in_channels)}
    inp |= {"noise_level": level, "text": draw(2, 9, cfg.text_dim), "text_mask": mask, "grid": shape}
    if "i2v" in case:
        inp |= {"condition": draw(2, tokens, cfg.condition_channels), "image": draw(2, 9, cfg.image_dim)}
    return model, inp


def _step(model, inp: dict) -> dict[str, object]:
    """Output, loss and every gradient of one forward/backward, and the weights after an SGD step."""
    from torch.distributed.tensor import DTensor

    from vidforge.parallel.tensor_parallel import reduce_partial_grads

    def full(t: torch.Tensor) -> torch.Tensor:
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()

    kwargs = {k: inp[k] for k in ("text_mask", "condition", "image", "grid") if k in inp}
    out = model(inp["x"], inp["noise_level"], inp["text"], **kwargs)
    loss = (out - inp["target"]).square().mean()
    loss.backward()
    reduce_partial_grads(model.parameters())
    grads = {name: full(p.grad) for name, p in model.named_parameters()}
    # SGD: its update is proportional to the gradient (AdamW's first step is its sign, which float32-sized
    # noise flips where a gradient is ~0); AdamW under the trainer is test_family_train_layouts.py's
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    optimizer.step()
    weights = {name: full(p) for name, p in model.named_parameters()}
    return {"out": full(out), "loss": full(loss), "grads": grads, "weights": weights}


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def _worker(rank: int, world_size: int) -> dict[str, dict[str, float]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from vidforge.errors import UserInputError
    from vidforge.families import family, load

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    errors = {}
    for case in CASES:
        model, inp = _build(case)
        want = _step(copy.deepcopy(model), inp)
        plan = load(family(model.config.family).tensor_parallel)
        plan(model, mesh["tp"], sequence_parallel=CASES[case][0])
        got = _step(model, inp)
        assert got["grads"].keys() == want["grads"].keys()
        errors[case] = {
            "out": _relative(got["out"], want["out"]),
            "loss": _relative(got["loss"], want["loss"]),
            **{f"grad {k}": _relative(got["grads"][k], v) for k, v in want["grads"].items()},
            **{f"weight {k}": _relative(got["weights"][k], v) for k, v in want["weights"].items()},
        }
        # what a rank holds, for the memory model's reading of the family's `tp_rules`
        errors[case]["rank parameters"] = sum(
            (p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()
        )
    # a level per token (image-to-video's first frame): refused under SP, not summed wrongly
    model, inp = _build("ltx2-split-sp")
    level = inp["noise_level"][:, None].expand(2, inp["x"].shape[1]).clone()
    load(family("ltx2").tensor_parallel)(model, mesh["tp"], sequence_parallel=True)
    try:
        _step(model, {**inp, "noise_level": level})
    except UserInputError as err:
        errors["token levels refused"] = str(err)
    return errors


@pytest.fixture(scope="module")
def tp2() -> list[dict[str, dict[str, float]]]:
    return run_ranks(_worker, 2)


@pytest.mark.parametrize("case", list(CASES))
def test_family_tp2_step_matches_one_process(tp2, case: str) -> None:
    for rank in tp2:
        errors = dict(rank[case])
        errors.pop("rank parameters")
        worst = max(errors, key=errors.get)
        assert errors[worst] < TOL, f"{case}: {worst} off by {errors[worst]:.2e} (relative)"


@pytest.mark.parametrize("case", list(CASES))
def test_family_tp_rules_count_what_the_plan_splits(tp2, case: str) -> None:
    """The memory model's parameters a rank holds (from the family's `tp_rules`) are what the plan left on
    each rank."""
    from vidforge.estimate.param_counts import parameter_counts, tp_local_parameters

    cfg = _build(case)[0].config
    counts = parameter_counts(cfg)
    assert counts.block_tp > 0  # the rules split something
    for rank in tp2:
        assert rank[case]["rank parameters"] == tp_local_parameters(counts, cfg.layers, 2)


def test_ltx2_sequence_parallel_refuses_a_level_per_token(tp2) -> None:
    """Per-token rows meet only a rank's tokens; the plan has no sum for them: one line, not a wrong
    gradient."""
    for rank in tp2:
        assert rank.get("token levels refused", "").startswith(
            "parallel.sequence_parallel: a noise level per"
        )
