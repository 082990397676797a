"""Parallel inference on 2 gloo ranks against one process with the same model and inputs.

- CFG-parallel: the conditional branch on rank 0, the unconditional on rank 1, exchanged by one
  all-gather; the guided denoiser and whole sampled latents equal the one-batch single-process ones.
- ScaleFusion: ST-DiT denoising with the sequence split over frames, all-to-alls between the spatial
  and temporal layouts, and the sliced, overlapped schedule; equal to the plain (synchronous, unsliced)
  schedule and to the single-process forward; its recorded issues, waits, computes and frees in the
  order of Algorithm 1 (as scalefusion.py reads it), receive buffers freed as slices finish.
- `vidforge infer` (`infer.run.run`) on 2 ranks, each way it splits the work (CFG-parallel, ScaleFusion,
  context-parallel DiT, st-hybrid parallel ST-DiT): rank 0 writes the single process's videos, frame for
  frame.
- Sampling that follows the layout (`infer.plan.parallel_sampler`): TP2 (infer.tp), the profile's
  parallel.cp_impl, TP2 x CFG-parallel, equal to single-process sampling; the plan and its one-line
  refusals; `vidforge bench infer --nproc 2`.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402
from train_fixtures import WAN  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

LATENT_SHAPE = (4, 4, 8, 8)  # C, T, H, W: 4 x 4 x 4 tokens with patch (1, 2, 2)


def _tiny_model(**overrides):
    from vidforge.models import build_model, model_config

    torch.manual_seed(0)
    model = build_model(model_config("tiny", **overrides), dtype=torch.float64).eval()
    with torch.no_grad():  # adaLN-Zero starts every block at the identity: perturb so the test has teeth
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _profile(*sets: str):
    from vidforge.profile import load_profile

    return load_profile("local_cpu", ["diffusion.steps=3", *sets])


def _captions(batch: int = 2):
    gen = torch.Generator().manual_seed(1)
    text = torch.randn(batch, 5, 32, generator=gen, dtype=torch.float64)
    mask = torch.ones(batch, 5, dtype=torch.bool)
    mask[1, 3:] = False
    negative = (torch.randn(1, 4, 32, generator=gen), torch.ones(1, 4, dtype=torch.bool))
    return text, mask, negative


def _by_value(results: dict[str, torch.Tensor]) -> dict:
    """Tensors as numpy arrays: a tensor put on run_ranks' queue travels as a shared-memory handle that
    the receiver can only open while the sending rank is still alive, which races with its exit."""
    return {name: value.detach().cpu().numpy() for name, value in results.items()}


def _as_tensors(per_rank: list[dict]) -> list[dict[str, torch.Tensor]]:
    return [{name: torch.from_numpy(value) for name, value in result.items()} for result in per_rank]


# --- one launch of 2 ranks computes everything the tests below compare ---------------------------------
# (each launch imports torch, and the infer run open_clip, in every rank: launching once keeps the file
# within its time budget)


def _worker(rank: int, world: int, exports: dict[str, Path], out: Path) -> dict[str, dict]:
    return {
        "cfg": _cfg_worker(rank, world),
        "scalefusion": _scalefusion_worker(rank, world),
        "infer": _infer_worker(rank, world, exports, out),
    }


@pytest.fixture(scope="module")
def infer_paths(tmp_path_factory) -> tuple[dict[str, Path], Path]:
    root = tmp_path_factory.mktemp("infer")
    return _exports(root), root / "parallel"


@pytest.fixture(scope="module")
def two_ranks(infer_paths) -> list[dict[str, dict]]:
    return run_ranks(_worker, 2, *infer_paths)


# --- CFG-parallel -------------------------------------------------------------------------------------


def _denoiser_input():
    x = torch.randn(2, *LATENT_SHAPE, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return x, torch.tensor(2.0, dtype=torch.float64)


def _cfg_worker(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Everything the CFG-parallel tests compare, from one launch of the two ranks."""
    import torch.distributed as dist

    from vidforge.diffusion import EDM
    from vidforge.parallel.cfg_parallel import parallel_classifier_free_guidance
    from vidforge.sampling.latents import sample_latents

    model = _tiny_model()
    text, mask, negative = _captions()

    def batched(x, sigma, uncond):
        net = lambda x_in, c: model(x_in, c, text, mask, drop_text=uncond)  # noqa: E731
        return EDM().denoise(net, x, sigma.expand(x.shape[0]))

    out = {}
    with torch.no_grad():
        out["denoiser"] = parallel_classifier_free_guidance(batched, 4.0, dist.group.WORLD)(
            *_denoiser_input()
        )
    for name, neg in (("null", None), ("negative", negative)):
        out[name] = sample_latents(
            model,
            _profile("diffusion.guidance=4.0"),
            text,
            mask,
            [3, 4],
            LATENT_SHAPE,
            neg,
            cfg_group=dist.group.WORLD,
        )
    return _by_value(out)


@pytest.fixture(scope="module")
def cfg_results(two_ranks) -> list[dict[str, torch.Tensor]]:
    return _as_tensors([result["cfg"] for result in two_ranks])


def test_cfg_parallel_denoiser_equals_one_batch_guidance(cfg_results) -> None:
    from vidforge.diffusion import EDM, classifier_free_guidance

    model = _tiny_model()
    text, mask, _ = _captions()

    def batched(x, sigma, uncond):  # [cond; uncond] rows in one batch, each with its sample's caption
        reps = x.shape[0] // text.shape[0]
        net = lambda x_in, c: model(x_in, c, text.repeat(reps, 1, 1), mask.repeat(reps, 1), drop_text=uncond)  # noqa: E731
        return EDM().denoise(net, x, sigma.expand(x.shape[0]))

    with torch.no_grad():
        reference = classifier_free_guidance(batched, 4.0)(*_denoiser_input())
    # float64 model. The ranks run batches of 2 rows where the reference runs 4, so matmul blocking
    # differs in the last bits (measured: 2e-15 apart, not bitwise equal): 1e-12 is float64 rounding.
    for result in cfg_results:
        torch.testing.assert_close(result["denoiser"], reference, rtol=1e-12, atol=1e-12)
    assert torch.equal(cfg_results[0]["denoiser"], cfg_results[1]["denoiser"])  # both mix the same answers


@pytest.mark.parametrize("unconditional", ["null", "negative"])
def test_cfg_parallel_sample_equals_single_process_sample(cfg_results, unconditional: str) -> None:
    from vidforge.sampling.latents import sample_latents

    text, mask, negative = _captions()
    reference = sample_latents(
        _tiny_model(),
        _profile("diffusion.guidance=4.0"),
        text,
        mask,
        [3, 4],
        LATENT_SHAPE,
        negative if unconditional == "negative" else None,
    )
    # The sampler state is float32 (sample_latents casts the network's output to float32), so a
    # last-bit float64 difference can round one float32 element the other way: float32 tolerance.
    for result in cfg_results:
        torch.testing.assert_close(result[unconditional], reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(cfg_results[0][unconditional], cfg_results[1][unconditional])


# --- ScaleFusion --------------------------------------------------------------------------------------

ST_LATENT = (4, 8, 8, 8)  # C, T, H, W: 8 frames x 4 x 4 positions; 4 frames and 8 positions per rank
LOCAL_FRAMES, LOCAL_POSITIONS = 4, 8
SLICINGS = {  # N_T, N_S, L_T, L_S
    "plain": (1, 1, 1, 1),
    "default": (4, 4, 1, 1),
    "deep": (4, 4, 2, 3),
    "uneven": (3, 2, 2, 2),  # frame slices of 2, 1, 1 frames; every position slice's all-to-all leaves early
    "clamped": (6, 8, 9, 1),  # 6 frame slices of 4 local frames make 4; lookahead 9 of 4 slices makes 4
}


def _st_inputs():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, *ST_LATENT, generator=gen, dtype=torch.float64)
    noise_level = torch.tensor([0.3, -0.2], dtype=torch.float64)
    text, mask, _ = _captions()
    return x, noise_level, text, mask, torch.tensor([False, True])


def _scalefusion_worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from vidforge.parallel.scalefusion import ScaleFusionSlicing, scalefusion_forward

    model = _tiny_model(architecture="stdit")
    x, noise_level, text, mask, drop = _st_inputs()
    outputs, traces = {}, {}
    for name, numbers in SLICINGS.items():
        traces[name] = _WatchedTrace()
        with _watch_receive_buffers(traces[name]):
            outputs[name] = scalefusion_forward(
                model,
                x,
                noise_level,
                text,
                mask,
                drop_text=drop,
                group=dist.group.WORLD,
                slicing=ScaleFusionSlicing(*numbers),
                trace=traces[name],
            )
    return {"outputs": _by_value(outputs), "traces": {name: list(t) for name, t in traces.items()}}


class _WatchedTrace(list):
    """A schedule's trace that also gets ("dead", block, phase, slice) when the garbage collector frees a
    receive tensor of that slice's all-to-alls (see `_watch_receive_buffers`): what the "free" events
    claim, observed. gloo's worker thread lets go of a finished all-to-all's tensors a moment after the
    wait returns, so a "free" is written once its slice's tensors are dead, or after a second, which
    only a reference that the schedule still holds lasts."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[tuple, int] = {}

    def collected(self, slice_: tuple) -> None:
        self.held[slice_] -= 1
        super().append(("dead", *slice_))

    def append(self, event: tuple) -> None:
        deadline = time.monotonic() + 1.0
        while event[0] == "free" and self.held.get(event[1:4]) and time.monotonic() < deadline:
            time.sleep(0.001)
        super().append(event)


@contextmanager
def _watch_receive_buffers(trace: _WatchedTrace):
    """Inside, each all-to-all's receive tensor tells `trace` when it is collected. The event just
    before an exchange is built is its "issue"."""
    from vidforge.parallel.scalefusion import _Exchange

    built = _Exchange.__init__

    def init(self, send, group):
        built(self, send, group)
        slice_ = tuple(trace[-1][1:4])
        trace.held[slice_] = trace.held.get(slice_, 0) + 1
        weakref.finalize(self.recv, trace.collected, slice_)

    _Exchange.__init__ = init
    try:
        yield
    finally:
        _Exchange.__init__ = built


@pytest.fixture(scope="module")
def scalefusion_results(two_ranks) -> list[dict[str, torch.Tensor]]:
    return _as_tensors([result["scalefusion"]["outputs"] for result in two_ranks])


@pytest.fixture(scope="module")
def scalefusion_traces(two_ranks) -> list[dict[str, list[tuple]]]:
    return [result["scalefusion"]["traces"] for result in two_ranks]


def test_scalefusion_plain_schedule_equals_single_process_forward(scalefusion_results) -> None:
    model = _tiny_model(architecture="stdit")
    x, noise_level, text, mask, drop = _st_inputs()
    with torch.no_grad():
        reference = model(x, noise_level, text, mask, drop_text=drop)
    # float64; spatial and temporal attention see the same tokens, only in other batch groupings
    for result in scalefusion_results:
        torch.testing.assert_close(result["plain"], reference, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("slicing", [name for name in SLICINGS if name != "plain"])
def test_scalefusion_overlapped_schedule_equals_plain_schedule(scalefusion_results, slicing: str) -> None:
    for result in scalefusion_results:
        assert torch.equal(result[slicing], result["plain"])


def _algorithm_1(n_t: int, n_s: int, l_t: int, l_s: int, depth: int) -> list[tuple]:
    """The events of the schedule in scalefusion.py's docstring, enumerated directly: the phases in
    order (spatial, temporal per block), each slice k of a phase with N slices and lookahead L issuing
    slice k+L's whole all-to-all, waiting for its own, computing, freeing, then sending piece k of each
    of the next phase's first L' slices. The first phase is fed by no all-to-all."""
    slices = {"spatial": min(n_t, LOCAL_FRAMES), "temporal": min(n_s, LOCAL_POSITIONS)}
    ahead = {"spatial": min(l_t, slices["spatial"]), "temporal": min(l_s, slices["temporal"])}
    phases = [(block, name) for block in range(depth) for name in ("spatial", "temporal")]
    events = []
    for index, (block, name) in enumerate(phases):
        fed = index > 0
        feeds = phases[index + 1] if index + 1 < len(phases) else None
        n, lookahead = slices[name], ahead[name]
        for k in range(n):
            if fed and k + lookahead < n:
                events.append(("issue", block, name, k + lookahead, None))
            if fed:
                events.append(("wait", block, name, k))
            events.append(("compute", block, name, k))
            if fed:
                events.append(("free", block, name, k))
            if feeds is not None:
                events += [("issue", *feeds, j, k) for j in range(ahead[feeds[1]])]
    return events


@pytest.mark.parametrize("slicing", list(SLICINGS))
def test_scalefusion_event_order_is_algorithm_1(scalefusion_traces, slicing: str) -> None:
    from vidforge.models import model_config

    depth = model_config("tiny", architecture="stdit").layers
    expected = _algorithm_1(*SLICINGS[slicing], depth)
    for traces in scalefusion_traces:
        assert [tuple(event) for event in traces[slicing] if event[0] != "dead"] == expected


@pytest.mark.parametrize("slicing", list(SLICINGS))
def test_scalefusion_frees_receive_buffers_as_slices_finish(scalefusion_traces, slicing: str) -> None:
    """Slices holding received data at once, counted in the recorded events (a slice from its first
    piece's issue to its free), are at most min(L+1, N) of the phase computing plus min(L', N') of the
    phase it feeds; every one is freed by the end, and by its "free" event the garbage collector has
    collected every tensor its all-to-alls received into."""
    n_t, n_s, l_t, l_s = SLICINGS[slicing]
    n_t, n_s = min(n_t, LOCAL_FRAMES), min(n_s, LOCAL_POSITIONS)
    l_t, l_s = min(l_t, n_t), min(l_s, n_s)
    bound = max(min(l_t + 1, n_t) + min(l_s, n_s), min(l_s + 1, n_s) + min(l_t, n_t))
    for traces in scalefusion_traces:
        live, peak, issued = set(), 0, set()
        in_flight: dict[tuple, int] = {}  # receive tensors of a slice not yet collected
        for kind, block, phase, k, *_ in traces[slicing]:
            slice_ = (block, phase, k)
            if kind == "issue":
                live.add(slice_)
                issued.add(slice_)
                in_flight[slice_] = in_flight.get(slice_, 0) + 1
            elif kind == "dead":
                in_flight[slice_] -= 1
            elif kind == "free":
                assert in_flight[slice_] == 0, f"{slice_} freed with its received data still held"
                live.remove(slice_)
            peak = max(peak, len(live))
        assert peak <= bound
        assert not live and issued  # every received slice freed; and there were all-to-alls at all


# --- vidforge infer on 2 ranks ------------------------------------------------------------------------

INFER_SETS = [
    "model.hidden=64",
    "model.mlp_hidden=256",
    "infer.frames=5",  # 2 latent frames of 4 x 6 tokens: 1 frame and 12 positions per rank
    "infer.height=16",
    "infer.width=24",
    "diffusion.steps=2",
]
PROMPTS = ["a red square moving right", "a blue circle"]
MODELS = {
    "stdit": ["model.architecture=stdit"],
    "stdit-parallel": ["model.architecture=stdit", "model.stdit_block=parallel"],
    "dit": ["model.architecture=dit"],
}
INFER_CASES = {  # what 2 ranks do (InferPlan): model, guidance
    "cfg-parallel": ("stdit", "diffusion.guidance=3"),
    "scalefusion": ("stdit", "diffusion.guidance=1"),
    "context-parallel": ("dit", "diffusion.guidance=1"),  # sample_latents_cp, all-gather CP
    "st-hybrid": ("stdit-parallel", "diffusion.guidance=1"),  # sample_latents_cp over apply_st_hybrid
}


def _case_sets(case: str) -> list[str]:
    model, guidance = INFER_CASES[case]
    return [*INFER_SETS, *MODELS[model], guidance]


@pytest.mark.parametrize(
    ("world", "guidance", "architecture", "expected"),
    [
        (2, 3.0, "stdit", (2, 1, None)),
        (2, 1.0, "stdit", (1, 2, "scalefusion")),
        (4, 3.0, "stdit", (2, 2, "scalefusion")),
        (4, 3.0, "dit", (2, 2, "context-parallel")),
        (4, 1.0, "dit", (1, 4, "context-parallel")),
        (2, 3.0, "dit", (2, 1, None)),
        (3, 3.0, "stdit", (1, 3, "scalefusion")),
    ],
)
def test_infer_plan_splits_guidance_branches_then_the_sequence(
    world, guidance, architecture, expected
) -> None:
    from vidforge.infer.plan import InferPlan
    from vidforge.models import model_config

    plan = InferPlan.choose(world, guidance, model_config("tiny", architecture=architecture))
    assert (plan.cfg, plan.sp, plan.method) == expected


def test_infer_refuses_a_token_grid_its_ranks_cannot_split() -> None:
    from vidforge.errors import UserInputError
    from vidforge.infer.plan import InferPlan, check_sequence_split
    from vidforge.models import model_config

    config = model_config("tiny", architecture="stdit", patch=(1, 1, 1))
    plan = InferPlan.choose(2, 1.0, config)
    check_sequence_split(plan, config, (4, 2, 4, 6))  # T=2, H*W=24: fine
    with pytest.raises(UserInputError, match="infer.frames, infer.height or infer.width"):
        check_sequence_split(plan, config, (4, 3, 4, 6))


def _exports(root: Path) -> dict[str, Path]:
    """One exported model per architecture, as `vidforge train` leaves them (weights + config)."""
    from vidforge.models import build_model
    from vidforge.profile import load_profile
    from vidforge.weights.checkpoint import save_model

    exports = {}
    for name, sets in MODELS.items():
        torch.manual_seed(0)
        model = build_model(load_profile("local_cpu", [*INFER_SETS, *sets]).model)
        with torch.no_grad():  # zero-initialised outputs would make every sample the same
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        exports[name] = save_model(model, root / name / "export")
    return exports


def _infer(exports: dict[str, Path], case: str, out: Path, log=None):
    from vidforge.infer.run import run

    model = exports[INFER_CASES[case][0]]
    return run(model, PROMPTS, out / case, overrides=_case_sets(case), profile="local_cpu", log=log)


def _infer_worker(rank: int, world: int, exports: dict[str, Path], out: Path) -> dict[str, list[str]]:
    results = {}
    for case in INFER_CASES:
        plan: list[str] = []
        results[case] = _infer(exports, case, out, log=plan.append).videos
        results[f"{case} plan"] = plan
    return results


def _frames(path: Path):
    import av
    import numpy as np

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_infer_on_two_ranks_writes_the_single_process_videos(two_ranks, infer_paths, tmp_path) -> None:
    import numpy as np

    exports, parallel_out = infer_paths
    ranks = [result["infer"] for result in two_ranks]
    assert {case: ranks[0][f"{case} plan"] for case in INFER_CASES} == {
        "cfg-parallel": ["2 ranks: CFG-parallel x2"],
        "scalefusion": ["2 ranks: ScaleFusion sequence parallel x2"],
        "context-parallel": ["2 ranks: context parallel x2"],
        "st-hybrid": ["2 ranks: context parallel x2"],
    }
    assert all(ranks[1][case] == [] for case in INFER_CASES)  # only rank 0 writes
    for case in INFER_CASES:
        single = _infer(exports, case, tmp_path / "single")
        assert [Path(v).name for v in ranks[0][case]] == [Path(v).name for v in single.videos]
        for parallel_video, single_video in zip(ranks[0][case], single.videos, strict=True):
            # float32 latents equal to rounding: a pixel may round the other way before H.264 encodes it,
            # and the encoder's choices then move a few blocks (measured in CI: mean 0.34 levels, max 29).
            # A wrong split or exchange gives another video: tens of levels on average.
            diff = np.abs(_frames(Path(parallel_video)).astype(int) - _frames(Path(single_video)).astype(int))
            assert diff.mean() < 2.0, (case, diff.mean(), diff.max())
        assert (parallel_out / case / "samples.jsonl").is_file()
    # and the videos carry the model: guidance and prompt change them
    guided, unguided = (_frames(Path(ranks[0][case][0])) for case in ("cfg-parallel", "scalefusion"))
    assert (guided != unguided).any()
    assert (_frames(Path(ranks[0]["scalefusion"][0])) != _frames(Path(ranks[0]["scalefusion"][1]))).any()


# --- sampling that follows the layout: each parallel.cp_impl, infer.tp, TP2 x CFG-parallel -------------
# By default one launch of 2 ranks: TP2, and ring context parallel (the cp_impl `vidforge infer` ignored
# before). VIDFORGE_TEST_ALL_LAYOUTS=1 adds a launch of 4 ranks: TP2 x CFG-parallel, CFG-parallel x ring
# CP2, all-gather, Ulysses, 2D (usp) and st-hybrid over 4 ranks, TP2 x ring CP2 (35-70 s more; `vidforge infer`
# on 2 ranks, above, runs all-gather CP and st-hybrid end to end by default).
# Each case: architecture, profile settings, the plan InferPlan.describe() gives, and what the sampler
# installed in the model (weights sharded by TP, each attention's cp method).

LAYOUT_CASES = {  # 2 ranks
    "tp2": ("dit", ["infer.tp=2", "diffusion.guidance=4.0"], "tensor parallel x2", (True, [])),
    "wan tp2": (  # the family a 14B comes in: wan's own TP plan (heads-spanning q/k norm), flow sampling
        "dit",
        [*WAN, "infer.tp=2", "diffusion.guidance=4.0"],
        "tensor parallel x2",
        (True, []),
    ),
    "cp2 ring": (
        "dit",
        ["parallel.cp_impl=ring", "diffusion.guidance=1"],
        "context parallel x2 (ring)",
        (False, ["ring"]),
    ),
    "cp2 st-spatial": (  # an ST-DiT sliced by (h, w) positions (sequential blocks: ScaleFusion otherwise)
        "stdit",
        ["parallel.cp_impl=st-spatial", "diffusion.guidance=1"],
        "context parallel x2 (st-spatial)",
        (False, ["st-spatial"]),
    ),
}
ALL_LAYOUT_CASES = {  # 4 ranks
    "tp2 x cfg2": (
        "dit",
        ["infer.tp=2", "diffusion.guidance=4.0"],
        "tensor parallel x2 and CFG-parallel x2",
        (True, []),
    ),
    "cfg2 x cp2 ring": (
        "dit",
        ["parallel.cp_impl=ring", "diffusion.guidance=4.0"],
        "CFG-parallel x2 and context parallel x2 (ring)",
        (False, ["ring"]),
    ),
    "cp4 all-gather": ("dit", ["diffusion.guidance=1"], "context parallel x4", (False, ["all-gather"])),
    "cp4 ulysses": (
        "dit",
        ["parallel.cp_impl=ulysses", "diffusion.guidance=1"],
        "context parallel x4 (ulysses)",
        (False, ["ulysses"]),
    ),
    "cp4 usp": (  # 2D: Ulysses over pairs of ranks, the ring across the two pairs
        "dit",
        ["parallel.cp_impl=usp", "parallel.cp_ulysses=2", "diffusion.guidance=1"],
        "context parallel x4 (usp)",
        (False, ["usp"]),
    ),
    "cp4 st-hybrid": (
        "stdit",
        ["model.stdit_block=parallel", "diffusion.guidance=1"],
        "context parallel x4",
        (False, ["st-hybrid"]),
    ),
    "tp2 x cp2 ring": (
        "dit",
        ["infer.tp=2", "parallel.cp_impl=ring", "diffusion.guidance=1"],
        "tensor parallel x2 and context parallel x2 (ring)",
        (True, ["ring"]),
    ),
}


def _layout_setup(case: tuple):
    architecture, sets = case[:2]
    block = [s.removeprefix("model.") for s in sets if s.startswith("model.")]
    model = _tiny_model(architecture=architecture, **dict(item.split("=") for item in block))
    return model, _profile("model.preset=tiny", f"model.architecture={architecture}", *sets)


def _layout_worker(rank: int, world: int, cases: dict) -> dict:
    from vidforge.infer.plan import InferPlan, check_plan, parallel_sampler, profile_slicing

    text, mask, negative = _captions()
    latents, plans = {}, {}
    for name, case in cases.items():
        model, prof = _layout_setup(case)
        plan = InferPlan.choose(
            world, prof.diffusion.guidance, model.config, prof.infer.tp, prof.parallel.cp_impl
        )
        check_plan(plan, prof)
        sampler = parallel_sampler(model, prof, plan, "cpu", profile_slicing(prof))
        latents[name] = sampler(text, mask, [3, 4], LATENT_SHAPE, negative)
        plans[name] = (plan.describe(), _installed(model))
    return {"latents": _by_value(latents), "plans": plans}


def _installed(model) -> tuple[bool, list[str]]:
    """What parallel_sampler put in the model: sharded (DTensor) weights, and each attention's cp method."""
    from torch.distributed.tensor import DTensor

    from vidforge.parallel.context_parallel import ContextParallelAttend
    from vidforge.parallel.st_spatial import STSpatialAttend
    from vidforge.parallel.stdit_parallel import STHybridAttend

    sharded = any(isinstance(p, DTensor) for p in model.parameters())
    methods = {
        "st-hybrid" if isinstance(m, STHybridAttend) else m.IMPL if isinstance(m, STSpatialAttend) else m.impl
        for m in model.modules()
        if isinstance(m, ContextParallelAttend)
    }
    return sharded, sorted(methods)


def _assert_single_process_sampling(cases: dict, ranks: list[dict]) -> None:
    from vidforge.sampling.latents import sample_latents

    assert {name: ranks[0]["plans"][name] for name in cases} == {
        name: (case[2], case[3]) for name, case in cases.items()
    }
    text, mask, negative = _captions()
    for name, case in cases.items():
        model, prof = _layout_setup(case)
        reference = sample_latents(model, prof, text, mask, [3, 4], LATENT_SHAPE, negative)
        for rank, result in enumerate(ranks):
            # float64 model; the sampler state is float32 (sample_latents casts the network's output),
            # and a sharded matmul or a ring's log-sum-exp merge sums in another order, so one element
            # may round the other way in float32: float32 tolerance. A wrong shard, head split or
            # exchange is off by the signal itself (order 1).
            got = torch.from_numpy(result["latents"][name])
            torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5, msg=f"{name}, rank {rank}")


def test_sampling_with_tp2_and_with_ring_cp2_equals_single_process_sampling() -> None:
    from vidforge.sampling.latents import sample_latents

    ranks = run_ranks(_layout_worker, 2, LAYOUT_CASES)
    _assert_single_process_sampling(LAYOUT_CASES, ranks)
    text, mask, _ = _captions()
    assert not torch.allclose(  # the negative caption and guidance matter: the cases are not trivial
        torch.from_numpy(ranks[0]["latents"]["tp2"]),
        sample_latents(*_layout_setup(LAYOUT_CASES["tp2"]), text, mask, [3, 4], LATENT_SHAPE),
    )


@pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") != "1",
    reason="4 more ranks (35-70 s): set VIDFORGE_TEST_ALL_LAYOUTS=1",
)
def test_sampling_with_each_cp_impl_and_tp2_x_cfg2_equals_single_process_sampling() -> None:
    _assert_single_process_sampling(ALL_LAYOUT_CASES, run_ranks(_layout_worker, 4, ALL_LAYOUT_CASES))


@pytest.mark.parametrize(
    ("world", "guidance", "architecture", "tp", "cp_impl", "expected"),
    [
        (4, 3.0, "dit", 2, "all-gather", (2, 2, 1, None, None)),
        (8, 3.0, "dit", 2, "ring", (2, 2, 2, "context-parallel", "ring")),
        (4, 1.0, "dit", 1, "ulysses", (1, 1, 4, "context-parallel", "ulysses")),
        (4, 1.0, "stdit-parallel", 2, "ring", (2, 1, 2, "context-parallel", "st-hybrid")),
        (2, 3.0, "dit", 2, "ring", (2, 1, 1, None, None)),
        # st-spatial slices a sequential ST-DiT by positions instead of ScaleFusion's frames
        (2, 1.0, "stdit", 1, "st-spatial", (1, 1, 2, "context-parallel", "st-spatial")),
        (2, 1.0, "stdit", 1, "ring", (1, 1, 2, "scalefusion", None)),
    ],
)
def test_infer_plan_holds_the_model_on_tp_ranks_then_splits_branches_and_sequence(
    world, guidance, architecture, tp, cp_impl, expected
) -> None:
    from vidforge.infer.plan import InferPlan
    from vidforge.models import model_config

    arch = {"architecture": "stdit", "stdit_block": "parallel"} if architecture == "stdit-parallel" else {}
    config = model_config("tiny", **(arch or {"architecture": architecture}))
    plan = InferPlan.choose(world, guidance, config, tp, cp_impl)
    assert (plan.tp, plan.cfg, plan.sp, plan.method, plan.cp_impl) == expected
    assert plan.layout().world_size == world


@pytest.mark.parametrize(
    ("world", "sets", "lora", "message"),
    [
        (4, ["infer.tp=3"], None, "infer.tp: 3 does not divide --nproc 4"),
        (2, ["infer.tp=4"], None, "infer.tp: 4 does not divide --nproc 2"),
        (6, ["infer.tp=3"], None, "infer.tp: must divide model.heads=4, got 3"),
        (
            8,
            ["parallel.cp_impl=ulysses", "diffusion.guidance=1"],
            None,
            "ulysses context parallel needs tp x cp = 8",
        ),
        (4, ["infer.tp=2", "model.architecture=stdit", "diffusion.guidance=1"], None, "ScaleFusion"),
        (
            6,
            ["parallel.cp_impl=usp", "parallel.cp_ulysses=4", "diffusion.guidance=1"],
            None,
            "parallel.cp_ulysses: 4 must divide parallel.cp=6",
        ),
        (2, ["infer.tp=2"], "runs/lora", "--lora: LoRA adapters have no tensor-parallel plan"),
        (
            2,
            ["model.architecture=stdit", "model.stdit_block=parallel-mm", "diffusion.guidance=1"],
            None,
            "model.stdit_block=parallel-mm has no context-parallel plan",
        ),
    ],
)
def test_infer_refuses_a_layout_it_cannot_sample_in_one_line(world, sets, lora, message) -> None:
    from vidforge.errors import UserInputError
    from vidforge.infer.plan import InferPlan, check_plan

    prof = _profile("model.preset=tiny", *sets)
    with pytest.raises(UserInputError) as err:
        plan = InferPlan.choose(
            world, prof.diffusion.guidance, prof.model, prof.infer.tp, prof.parallel.cp_impl
        )
        check_plan(plan, prof, lora)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- vidforge bench infer --nproc 2 -------------------------------------------------------------------

BENCH_TINY = [
    *("model.preset=tiny", "model.hidden=64", "model.mlp_hidden=256", "model.patch=[1,2,2]"),
    *("model.in_channels=4", "model.abs_position=none", "train.precision=fp32"),
    *("bench.latent_frames=2", "bench.latent_height=8", "bench.latent_width=8", "bench.text_tokens=4"),
    *("bench.warmup=1", "bench.repeats=2", "diffusion.steps=3", "infer.batch_size=1"),
]


def test_bench_infer_nproc_2_times_ring_sampling_against_one_process() -> None:
    import json
    import subprocess

    sets = [*BENCH_TINY, "diffusion.guidance=1", "parallel.cp_impl=ring"]
    argv = ["--json", "bench", "infer", "--nproc", "2", *(a for s in sets for a in ("--set", s))]
    exe = Path(sys.executable).with_name("vidforge")
    proc = subprocess.run(
        [str(exe), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if '"event": "result"' in line]
    assert len(results) == 1  # one report, from rank 0
    result = results[0]
    one, two = result["rows"]
    assert (one["layout"], one["ranks"]) == ("1 process", 1)
    assert (two["layout"], two["ranks"]) == ("context parallel x2 (ring)", 2)
    for row in (one, two):
        assert row["end_to_end_s"] > 0
        assert row["per_step_s"] == pytest.approx(row["end_to_end_s"] / 3)
        assert row["speedup"] == pytest.approx(one["end_to_end_s"] / row["end_to_end_s"])
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["ranks"])
    # The same random (perturbed) model and noise: the 2 ranks' latents are the one process's up to float32
    # rounding. The ring merges two blocks' softmax by log-sum-exp, another summation order, on states
    # that start at sigma_max = 80 (float32's spacing there is 7.6e-6; measured 3.4e-5 after 3 Heun
    # steps). A wrong split or exchange is off by the signal itself, order 1.
    assert result["max_abs_diff"] < 1e-3


def test_infer_tp_on_one_process_is_one_line_exit_2(tmp_path) -> None:
    from typer.testing import CliRunner

    from vidforge.cli.app import app

    export = _exports(tmp_path)["dit"]
    argv = ["infer", "-c", str(export), "--prompt", "a cat", "-o", str(tmp_path / "out"), "--tp", "2"]
    result = CliRunner().invoke(app, [*argv, "--profile", "local_cpu"])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert "infer.tp: 2 ranks hold the model tensor-parallel, but one process runs; use --nproc 2" in line
    assert not (tmp_path / "out").exists()
