"""`vidforge train` under model-parallel layouts against one process: the same data, the same initial
weights and the same noise, so each step's loss must agree; what differs is only how the model, its
activations and gradients are split over ranks. fp32 on CPU: the tolerance (relative 1e-4 over 3 steps
of AdamW) covers reduction-order differences; a wrong gradient moves the third loss by far more.

Pipeline layouts: with bucket batches the pipeline splits each batch of data.batch_size samples into
parallel.pp_microbatches micro-batches (reference: one process on the same batches); with packed rows a
step takes pp_microbatches rows (reference: one process accumulating as many rows, train.grad_accum).
The model they export, gathered from the stages, must equal that process's.

Runs `vidforge.train.loop.run` in gloo processes (tests/distributed/ranks.py), one per rank."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from planned_layouts import Miniature, planned_miniatures  # noqa: E402
from ranks import run_ranks  # noqa: E402
from train_fixtures import WAN, losses, make_latents, probe_forward, train_profile  # noqa: E402

# About 6 minutes under `make test` (its layouts 17-52 s each): the longest of the multi-process files, so
# it starts first among them (tests/conftest.py) rather than alone at the end.
pytestmark = [pytest.mark.slow(minutes=6), pytest.mark.distributed]

STEPS = ("train.steps=3", "train.ema_decay=0", "model.heads=4", "data.token_budget=432")

BUCKETS = ("data.packing=false", "data.batch_size=2")  # bucket batches of 2 samples, not packed rows
CLIP = ("train.grad_clip=0.05",)  # below the gradient norms (~0.2): every step is clipped

EMA = ("train.ema_decay=0.9",)  # the export is then the EMA's weights
# Flow with x-prediction: a loss whose error is scaled per sample (1 / t), per token of a cp shard and
# split with the rows of pipeline micro-batches.
XPRED = ("diffusion.objective=flow", "diffusion.flow_prediction=clean")

# Vchitect-2.0's multimodal parallel block (ST-DiT): it has no tensor- or context-parallel plan.
MM = ("model.architecture=stdit", "model.stdit_block=parallel-mm")

# name -> (ranks, profile overrides)
LAYOUTS = {
    # context parallel (ring) with FSDP2 over the cp ranks, on the wan family
    "wan-cp2-ring": (2, ["parallel.cp=2", "parallel.cp_impl=ring", *WAN]),
    # tensor + sequence parallel (the default) with Wan's q/k norms across all heads (sum of squares
    # all-reduced), on packed rows whose sequence split cuts through samples
    "wan-tp2-sp": (2, ["parallel.tp=2", *WAN, *EMA]),
    # Wan's stages: patch_embedding first; norm_out, proj_out and the output scale_shift_table last
    "wan-pp2": (2, ["parallel.pp=2", "parallel.pp_microbatches=2", *CLIP, *WAN]),
    "tp2": (2, ["parallel.tp=2", *EMA]),  # EMA over tensor-parallel and replicated parameters
    "tp2xcp2": (4, ["parallel.tp=2", "parallel.cp=2", "parallel.cp_impl=ring"]),
    "pp2-1f1b": (
        2,
        ["parallel.pp=2", "parallel.pp_schedule=1f1b", "parallel.pp_microbatches=2", *BUCKETS, *CLIP, *XPRED],
    ),
    # ring context parallel (its plain-loss case is wan-cp2-ring's)
    "cp2-ring-xpred": (2, ["parallel.cp=2", "parallel.cp_impl=ring", *XPRED]),
    "pp2xfsdp2": (4, ["parallel.pp=2", "parallel.dp_shard=2", "parallel.pp_microbatches=2", *CLIP]),
}
# 2D context parallel (cp_impl=usp): Ulysses inside cp ranks {0, 1} and {2, 3}, the ring across them.
USP = ("parallel.cp=4", "parallel.cp_impl=usp", "parallel.cp_ulysses=2")
LAYOUTS["cp4-usp"] = (4, list(USP))
# Covered at module level by the parallel code's own tests (tests/distributed/test_context_parallel.py,
# test_tensor_parallel.py); run through the training loop too with VIDFORGE_TEST_ALL_LAYOUTS=1 (each
# multi-rank run costs 20-40 s on 2 cores, and `make test` has a 20-minute budget).
if os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") == "1":
    LAYOUTS |= {
        "cp2-ring": (2, ["parallel.cp=2", "parallel.cp_impl=ring"]),
        # 3D (8 ranks, 120 s here): its dimensions pairwise are tp2xcp2's, and FSDP2's with each elsewhere
        "dp2xtp2xcp2": (8, ["parallel.dp_shard=2", "parallel.tp=2", "parallel.cp=2"]),
        "pp2xtp2": (4, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_microbatches=2", *CLIP]),  # with SP
        "cp2-all-gather": (2, ["parallel.cp=2", "parallel.cp_impl=all-gather"]),
        "cp2-ulysses": (2, ["parallel.cp=2", "parallel.cp_impl=ulysses"]),
        "fsdp2xtp2": (4, ["parallel.dp_shard=2", "parallel.tp=2"]),
        "wan-cp2-all-gather": (2, ["parallel.cp=2", "parallel.cp_impl=all-gather", *WAN]),
        "wan-cp2-ulysses": (2, ["parallel.cp=2", "parallel.cp_impl=ulysses", *WAN]),
        "wan-fsdp2": (2, ["parallel.dp_shard=2", *WAN]),
        "mm-fsdp2": (2, ["parallel.dp_shard=2", *MM]),
        "mm-pp2": (2, ["parallel.pp=2", "parallel.pp_microbatches=2", *CLIP, *MM]),
        "wan-tp2": (2, ["parallel.tp=2", "parallel.sequence_parallel=false", *WAN, *EMA]),
        "wan-fsdp2xtp2-sp": (4, ["parallel.dp_shard=2", "parallel.tp=2", *WAN]),
        "wan-pp2xtp2-sp": (4, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_microbatches=2", *CLIP, *WAN]),
    }
    LAYOUTS["fsdp2xcp4-usp"] = (8, ["parallel.dp_shard=2", *USP])  # 2D CP inside FSDP (over dp_shard x cp)
# Pipeline x context parallel: each stage holds its cp rank's shard of the stream. One layout by default
# (ring over packed rows, 4 ranks, sharing pp2xfsdp2's reference run); the other cp_impls, bucket batches
# pp2 x cp2 x tp2 (8 ranks) and the wan family with VIDFORGE_TEST_ALL_LAYOUTS=1.
PP2 = ("parallel.pp=2", "parallel.pp_microbatches=2", *CLIP)
LAYOUTS["pp2xcp2-ring"] = (4, [*PP2, "parallel.cp=2", "parallel.cp_impl=ring"])
if os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") == "1":
    LAYOUTS |= {
        "pp2xcp2-all-gather": (4, [*PP2, "parallel.cp=2", "parallel.cp_impl=all-gather"]),
        "pp2xcp2-ulysses-buckets": (4, [*PP2, "parallel.cp=2", "parallel.cp_impl=ulysses", *BUCKETS]),
        "pp2xcp2xtp2": (8, [*PP2, "parallel.cp=2", "parallel.cp_impl=ring", "parallel.tp=2"]),
        "wan-pp2xcp2-ring": (4, [*PP2, "parallel.cp=2", "parallel.cp_impl=ring", *WAN]),
    }


def miniature(name: str) -> tuple[int, list[str]]:
    """A shipped profile's layout in miniature for the tiny model: degree 2 in each mesh dimension it
    uses, with its cp_impl, pipeline schedule, micro-batches, sequence parallel and recompute. Returns
    (ranks, overrides)."""
    from vidforge.profile import load_profile
    from vidforge.profile.layout_rules import sequence_parallel

    profile = load_profile(name)
    layout, par = profile.layout, profile.parallel
    degrees = {dim: min(degree, 2) for dim, degree in layout.degrees().items()}
    sets = [f"parallel.{dim}={degree}" for dim, degree in degrees.items()]
    sets += [
        f"parallel.cp_impl={par.cp_impl}",
        f"parallel.pp_schedule={par.pp_schedule}",
        f"parallel.vpp={layout.vpp}",
        f"parallel.pp_microbatches={layout.pp_microbatches}",
        f"parallel.sequence_parallel={str(sequence_parallel(profile)).lower()}",
        f"train.activation_checkpointing={profile.train.activation_checkpointing}",
        *CLIP,
    ]
    ranks = degrees["pp"] * degrees["dp_replicate"] * degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    return ranks, sets


# The shipped 512-GPU profile (pp2 x dp_shard8 x cp8 x tp4, ring, 1F1B over 4 micro-batches) as
# pp2 x dp_shard2 x cp2 x tp2 on 16 processes: its 4 micro-batches a step are 4 packed rows per data-parallel
# rank (every sample the same clip: one process accumulating 4 rows is the reference).
if os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") == "1":
    LAYOUTS["pp-dit28b_74k_tp4_cp8_pp2_512xh100"] = miniature("dit28b_74k_tp4_cp8_pp2_512xh100")

# Layouts whose single-process reference differs from the default one: name -> reference overrides.
# (pp2xfsdp2's and pp2xtp2's 2 micro-batches per step are 2 packed rows: one process accumulates 2 rows.)
REFERENCE_SETS = {
    **{name: WAN for name in LAYOUTS if name.startswith("wan")},
    "wan-tp2-sp": (*WAN, *EMA),
    "wan-tp2": (*WAN, *EMA),
    "wan-pp2": ("train.grad_accum=2", *CLIP, *WAN),  # its 2 micro-batches are 2 packed rows
    "wan-pp2xtp2-sp": ("train.grad_accum=2", *CLIP, *WAN),
    "tp2": EMA,
    "mm-fsdp2": MM,
    "mm-pp2": ("train.grad_accum=2", *CLIP, *MM),
    "pp2-1f1b": (*BUCKETS, *CLIP, *XPRED),
    "cp2-ring-xpred": XPRED,
    "pp2xfsdp2": ("train.grad_accum=2", *CLIP),  # the same reference run as pp2xtp2
    "pp2xtp2": ("train.grad_accum=2", *CLIP),
    "pp2xcp2-ring": ("train.grad_accum=2", *CLIP),
    "pp2xcp2-all-gather": ("train.grad_accum=2", *CLIP),
    "pp2xcp2-ulysses-buckets": (*BUCKETS, *CLIP),
    "pp2xcp2xtp2": ("train.grad_accum=2", *CLIP),
    "pp-dit28b_74k_tp4_cp8_pp2_512xh100": ("train.grad_accum=4", *CLIP),
    "wan-pp2xcp2-ring": ("train.grad_accum=2", *CLIP, *WAN),  # wan-pp2's reference
}

# Every layout shape `bench plan --rank` proposes for the NeMo profiles, in miniature (planned_layouts.py).
# A shape that a layout above has is trained there; the others join LAYOUTS: by default one sample, the
# best-placed of at most 4 ranks (each multi-rank run costs 20-40 s here), all of them with
# VIDFORGE_TEST_ALL_LAYOUTS=1. A pipeline takes 2 packed rows a step: one process accumulating 2 rows.
PIPELINE_MICRO = ("parallel.pp_microbatches=2", *CLIP)
TRAINED_SHAPES = {
    Miniature.of_sets(ranks, sets)
    for ranks, sets in LAYOUTS.values()
    if not any(s.startswith("model.") for s in sets)
}
UNTRAINED = [mini for mini in planned_miniatures() if mini not in TRAINED_SHAPES]
for mini in (
    UNTRAINED
    if os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") == "1"
    else [m for m in UNTRAINED if m.ranks <= 4][:1]
):
    assert mini.name not in LAYOUTS, mini.name
    LAYOUTS[mini.name] = (mini.ranks, [*mini.sets(), *(PIPELINE_MICRO if mini.pipelined else ())])
    if mini.pipelined:
        REFERENCE_SETS[mini.name] = ("train.grad_accum=2", *CLIP)

# Layouts whose last checkpoint one process then takes as `--init RUN`: tensor-parallel DTensor shards
# with an EMA (tp2: its EMA), pipeline stages' FSDP shards without one (pp2xfsdp2: the raw weights). Read
# with DCP, either gives the layout's export's forward exactly.
INIT_FROM_CHECKPOINT = ("tp2", "pp2xfsdp2")


def _train(rank: int, world: int, latents: str, run_dir: str, sets: list[str]) -> None:
    from vidforge.train import loop

    profile = train_profile(*STEPS, f"cluster.cpu_processes={world}", "parallel.dp_shard=-1", *sets)
    loop.run(profile, [latents], run_dir)


def _metric(run_dir: Path, key: str) -> list[float]:
    return [json.loads(line)[key] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """reference(sets) -> (latents, single-process run directory), each reference run once per module."""
    root = tmp_path_factory.mktemp("layouts")
    # Every sample the same clip: data-parallel ranks then see what the single process sees.
    latents = make_latents(root / "data", identical=True, samples=4)
    runs: dict[tuple[str, ...], Path] = {}

    def get(sets: tuple[str, ...] = ()) -> tuple[Path, Path]:
        if sets not in runs:
            runs[sets] = root / f"single{len(runs)}"
            run_ranks(_train, 1, str(latents), str(runs[sets]), list(sets))
        return latents, runs[sets]

    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(name, reference, tmp_path) -> None:
    latents, single_dir = reference(REFERENCE_SETS.get(name, ()))
    single = losses(single_dir)
    ranks, sets = LAYOUTS[name]
    run_ranks(_train, ranks, str(latents), str(tmp_path / name), sets)
    got = losses(tmp_path / name)
    assert len(got) == len(single) == 3
    assert got == pytest.approx(single, rel=1e-4, abs=1e-6)
    assert len(set(single)) > 1  # training moved the weights: later losses differ
    if "pp" in name:
        # The whole model's gradient norm, each replicated (conditioning) gradient counted once.
        norms = [_metric(d, "grad_norm") for d in (tmp_path / name, single_dir)]
        assert norms[0] == pytest.approx(norms[1], rel=1e-4)
    # Stages / shards gathered into one export == one process's.
    if name.startswith(("pp", "tp2", "wan", "mm")):
        from vidforge.weights.checkpoint import load_model

        ours, theirs = load_model(tmp_path / name / "export"), load_model(single_dir / "export")
        mine = dict(ours.named_parameters())
        assert mine.keys() == dict(theirs.named_parameters()).keys()
        for key, value in theirs.named_parameters():
            if name.startswith("wan"):
                # Wan's zero-padded captions leave some weights (the cross-attention's to_v) with
                # gradients at rounding-noise size, and AdamW moves such an element by about lr whatever
                # its sign: reduction-order noise may flip a few of those steps (seen once in CI). A wrong
                # gather or shard order changes whole tensors, which the mean catches.
                diff = (mine[key] - value).abs()
                assert diff.max() <= 6e-3 and diff.mean() <= 2e-5, (key, diff.max(), diff.mean())
                continue
            # 3 AdamW steps of lr 1e-3 from equal weights: reduction-order noise only
            torch.testing.assert_close(mine[key], value, rtol=1e-4, atol=1e-5, msg=key)
    if name in INIT_FROM_CHECKPOINT:
        from vidforge.models import build_model
        from vidforge.train.init_weights import init_from
        from vidforge.weights.checkpoint import load_model

        profile = train_profile(*STEPS, *REFERENCE_SETS.get(name, ()))
        model = build_model(profile.model)
        assert init_from(model, tmp_path / name).complete
        exported = load_model(tmp_path / name / "export")
        assert torch.equal(probe_forward(model, profile), probe_forward(exported, profile))


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["train.grad_accum=2"], "train.grad_accum"),
        (["data.packing=false", "data.batch_size=3"], "data.batch_size"),
        (["train.validate_every=1"], "train.validate_every"),
    ],
)
def test_pipeline_refuses_what_it_cannot_do(sets, field) -> None:
    """The layout rulebook refuses these when the profile loads, naming the field."""
    from vidforge.profile import ProfileError

    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        train_profile("cluster.cpu_processes=4", "parallel.pp=2", "parallel.pp_microbatches=2", *sets)


# Joint image-video training under ST-DiT sequence parallel sliced by space (parallel.cp_impl=st-spatial):
# images (1 frame -> latent T = 1) and 9-frame clips (T = 3) packed into rows, which st-hybrid's split by
# frames refuses under cp=2. Its own data (the shared reference's clips are all 9 frames): 2 images and 2
# clips, 192 tokens an epoch, so the 3 full rows of 432 tokens take every sample several times.
JOINT = ("model.architecture=stdit", "data.frame_buckets=[1,9]")


def test_st_spatial_joint_image_video_matches_one_process(tmp_path) -> None:
    from vidforge.data.shard_index import read_index
    from vidforge.data.shard_reader import iter_shard
    from vidforge.profile import ProfileError

    latents = make_latents(tmp_path / "data", samples=2, images=2, sets=JOINT)
    index = read_index(latents)
    frames = sorted(s["json"]["latent_shape"][1] for e in index.shards for s in iter_shard(index.path(e), e))
    assert frames == [1, 1, 3, 3]  # two images and two clips, as latents
    with pytest.raises(
        ProfileError, match="1 frames give 1 latent token frames, not divisible by parallel.cp=2"
    ):
        train_profile(*JOINT, "cluster.cpu_processes=2", "parallel.cp=2", "parallel.cp_impl=st-hybrid")
    run_ranks(_train, 1, str(latents), str(tmp_path / "single"), list(JOINT))
    sets = ["parallel.cp=2", "parallel.cp_impl=st-spatial", *JOINT]
    run_ranks(_train, 2, str(latents), str(tmp_path / "st-spatial"), sets)
    single, got = losses(tmp_path / "single"), losses(tmp_path / "st-spatial")
    assert len(got) == len(single) == 3 and len(set(single)) > 1
    assert got == pytest.approx(single, rel=1e-4, abs=1e-6)


def test_every_planned_layout_shape_loads_in_miniature() -> None:
    """Each shape the planner ranks for the NeMo profiles, at degree 2 on the tiny model, is a layout the
    trainer accepts when the profile loads (the rulebook), and keeps its shape there."""
    planned = planned_miniatures()
    assert len(planned) > 10 and all(mini.ranks <= 8 for mini in planned)
    for mini in planned:
        sets = [*mini.sets(), *(PIPELINE_MICRO if mini.pipelined else ())]
        profile = train_profile(*STEPS, f"cluster.cpu_processes={mini.ranks}", *sets)
        assert profile.layout.world_size == mini.ranks
        assert Miniature.of(profile.layout, profile.parallel.cp_impl, profile.parallel.pp_schedule) == mini
