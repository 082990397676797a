"""Pipeline parallel (GPipe, 1F1B, interleaved 1F1B; alone and under FSDP2) on gloo ranks vs one process.

Each rank builds the same float64 tiny DiT (moved off its adaLN-Zero start so every parameter gets a
gradient), splits it, and runs the training step's pipeline implementation (`PipelineTrainStep` over a
`PipelineRunner`). The reference is the whole model in one process, drawing noise levels, caption
dropout and noise in the training loop's order from the same seed, with the EDM loss written the usual
way, lambda(sigma) (D - y)^2 through `EDM.denoise` and `EDM.loss_weight`, in float64. Compared: the loss, the per-sample losses, every parameter's gradient gathered by name from the
stages (each stage's copy of a conditioning parameter must hold the whole model's gradient), the clipped
gradient norm, and three clipped AdamW steps (losses and final weights). One run of 4 ranks, mesh
(pp=2, dp_shard=2), serves every case: pp=2 pipelines on dp_shard rank 0, and pp=2 x FSDP2 over all four.

Tolerances: both sides are float64 and differ only in summation order and in the identity
lambda c_out^2 = 1 (the step's squared error on the raw output), so rtol 1e-9. The one-module step's
loss (`DenoisingLoss` on the whole model) is checked on the first step too, at rtol 1e-6.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402

from vidforge.data.batching import BucketBatch, PackedBatch  # noqa: E402
from vidforge.diffusion import EDM, build_objective  # noqa: E402
from vidforge.models import build_model, model_config, pack_latents  # noqa: E402
from vidforge.profile import load_profile  # noqa: E402
from vidforge.train.loss import DenoisingLoss  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

RTOL, ATOL = 1e-9, 1e-12
STEPS, LR, MAX_NORM = 3, 1e-2, 0.5


def _profile(schedule: str, vpp: int, layers: int, microbatches: int = 0, dp_shard: int = 1):
    return load_profile(
        "local_cpu",
        [
            "parallel.pp=2",
            f"parallel.vpp={vpp}",
            f"parallel.pp_schedule={schedule}",
            f"parallel.pp_microbatches={microbatches}",
            f"parallel.dp_shard={dp_shard}",
            f"cluster.cpu_processes={2 * dp_shard}",
            f"model.layers={layers}",
            "diffusion.caption_dropout=0.5",
        ],
    )


def _model(layers: int, arch: str):
    cfg = model_config("tiny", layers=layers, architecture=arch, adaln_lora_rank=4, hidden=32, mlp_hidden=64)
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _text(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    text = torch.randn(n, 3, 32, generator=g, dtype=torch.float64)
    mask = torch.ones(n, 3, dtype=torch.bool)
    mask[0, 2:] = False
    return text, mask


def _bucket_batch() -> BucketBatch:
    g = torch.Generator().manual_seed(2)
    latents = torch.randn(4, 4, 2, 4, 4, generator=g, dtype=torch.float64)
    text, mask = _text(4, g)
    return BucketBatch(latents, text, mask, [f"s{i}" for i in range(4)], [{}] * 4)


def _packed_rows() -> list[PackedBatch]:
    g = torch.Generator().manual_seed(3)
    rows = []
    for shapes in ([(2, 4, 4), (1, 2, 4)], [(1, 4, 2), (2, 2, 2), (1, 2, 2)]):
        latents = [torch.randn(4, *s, generator=g, dtype=torch.float64) for s in shapes]
        tokens, layout = pack_latents(latents, (1, 2, 2))
        text, mask = _text(len(shapes), g)
        rows.append(PackedBatch(tokens, layout, text, mask, [], [tuple(x.shape) for x in latents], 16, []))
    return rows


def _batches(packed: bool):
    return _packed_rows() if packed else _bucket_batch()


def _edm_loss64(model, edm: EDM, batch, caption_dropout: float):
    """The EDM loss of one micro-batch as `DenoisingLoss.draw` draws it, kept in float64 throughout."""
    text, mask = batch.text_emb, batch.text_mask
    n = text.shape[0]
    sigma = edm.sample_levels(n)
    drop = torch.rand(n) < caption_dropout
    if isinstance(batch, PackedBatch):
        clean, layout = batch.tokens, batch.layout
        sigma_b = layout.per_token(sigma.double())[..., None]

        def network(x, c_noise):
            return model(x, c_noise, text, mask, layout=layout, drop_text=drop)
    else:
        clean = batch.latents
        sigma_b = edm.expand(sigma.double(), clean)

        def network(x, c_noise):
            return model(x, c_noise, text, mask, drop_text=drop)

    noise = torch.randn(clean.shape, dtype=clean.dtype)
    denoised = edm.denoise(network, clean + sigma_b * noise, sigma, sigma_b)
    elementwise = edm.loss_weight(sigma_b) * (denoised - clean) ** 2
    if isinstance(batch, PackedBatch):
        per_token = elementwise.mean(dim=-1)[0]
        per_sample = torch.stack(
            [per_token[a:b].mean() for a, b in zip(layout.offsets, layout.offsets[1:], strict=False)]
        )
    else:
        per_sample = elementwise.flatten(1).mean(dim=1)
    return elementwise.mean(), per_sample.detach()


def _reference(layers: int, arch: str, packed: bool, profile) -> dict:
    """One process: gradients of step 1, then STEPS clipped AdamW steps."""
    model = _model(layers, arch).train()
    edm = build_objective(profile.diffusion)
    dropout = profile.diffusion.caption_dropout
    one_module = DenoisingLoss(edm, dropout, model.config.patch, model.config.in_channels)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    torch.manual_seed(5)
    out: dict = {"losses": [], "norms": []}
    for step in range(STEPS):
        batch = _batches(packed)
        rows = batch if packed else [batch]
        if step == 0:  # the training loop's own loss, from the same draws
            state = torch.get_rng_state()
            with torch.no_grad():
                inputs = [one_module.draw(r, torch.device("cpu")) for r in rows]
                micro = [one_module.reduce(model(i.x, **i.model_kwargs), i) for i in inputs]
            out["loop_loss"] = sum(m.loss.item() for m in micro) / len(rows)
            torch.set_rng_state(state)
        results = [_edm_loss64(model, edm, r, dropout) for r in rows]
        loss = sum(loss for loss, _ in results) / len(rows)
        loss.backward()
        out["losses"].append(loss.item())
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
            out["per_sample"] = torch.cat([per_sample for _, per_sample in results])
        out["norms"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


# name -> (pp_schedule, vpp, layers, architecture, packed rows, pp_microbatches, whole-batch split, FSDP)
CASES = {
    "gpipe": ("gpipe", 1, 2, "dit", False, 0, False, False),
    "1f1b": ("1f1b", 1, 2, "stdit", False, 4, False, False),
    "interleaved": ("interleaved-1f1b", 2, 4, "dit", False, 0, False, False),
    "packed": ("1f1b", 1, 2, "dit", True, 0, False, False),
    "whole_batch": ("gpipe", 1, 2, "dit", False, 0, True, False),
    "interleaved_fsdp": ("interleaved-1f1b", 2, 4, "dit", False, 0, False, True),
}
WORLD = 4  # mesh (pp=2, dp_shard=2): two pipelines side by side, sharded together in the FSDP case


def _pipeline_step(mesh, profile, layers: int, arch: str, fsdp: bool = False):
    """The training step's pipeline implementation over this rank's stages of the test model (float64,
    built here rather than from the profile). With `fsdp`, PP first, then FSDP2 on each stage module
    over dp_shard (both dp ranks see the same batch and draws, so the average is the same)."""
    import torch.distributed as dist

    from vidforge.parallel.dims import ParallelDims
    from vidforge.parallel.fsdp import apply_fsdp
    from vidforge.parallel.pipeline import PipelineRunner
    from vidforge.parallel.runtime import Runtime
    from vidforge.train.build import TrainParts
    from vidforge.train.step import PipelineTrainStep

    cpu = torch.device("cpu")
    runner = PipelineRunner(
        _model(layers, arch), mesh["pp"], profile.layout, profile.parallel.pp_schedule, cpu
    )
    if fsdp:
        for module in runner.stage_modules:
            apply_fsdp(
                module, mesh["dp_shard"], module.blocks, param_dtype=torch.float64, reduce_dtype=torch.float64
            )
    optimizer = torch.optim.AdamW(runner.parameters(), lr=LR)
    parts = TrainParts(list(runner.stage_modules), [optimizer], None, None, runner)
    runtime = Runtime(dist.get_rank(), dist.get_world_size(), 0, cpu, ParallelDims(profile.layout, "cpu"))
    return PipelineTrainStep(profile, runtime, parts)


def _train_pipeline(mesh, schedule, vpp, layers, arch, packed, microbatches, whole_batch, fsdp) -> dict:
    """STEPS clipped AdamW steps through the pipeline."""
    profile = _profile(schedule, vpp, layers, microbatches, dp_shard=2 if fsdp else 1)
    step = _pipeline_step(mesh, profile, layers, arch, fsdp)
    runner = step.runner
    if whole_batch:
        runner.presplit = False  # the torch < 2.12 path: the schedule splits one whole batch
    runner.train()
    torch.manual_seed(5)
    out: dict = {"losses": [], "norms": [], "stage_ids": runner.stage_ids}
    for i in range(STEPS):
        batches = _batches(packed)
        done = step.forward_backward(batches if packed else [batches])
        out["losses"].append(done.loss)
        if i == 0:
            out["grads"] = [
                {n: _full(p.grad).clone() for n, p in m.named_parameters()} for m in runner.stage_modules
            ]
            out["per_sample"] = done.per_sample.clone()
        out["norms"].append(step.clip_grad_norm_(MAX_NORM))
        step.apply()
    out["params"] = [
        {n: _full(p.detach()).clone() for n, p in m.named_parameters()} for m in runner.stage_modules
    ]
    return out


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _accumulate_two_steps(mesh) -> list[dict]:
    """Two interleaved (vpp=2) pipeline steps into the same .grad, no optimizer step between."""
    step = _pipeline_step(mesh, _profile("interleaved-1f1b", 2, 4), 4, "dit")
    torch.manual_seed(5)
    for _ in range(2):
        step.forward_backward([_batches(False)])
    return [{n: p.grad.clone() for n, p in m.named_parameters()} for m in step.runner.stage_modules]


def _pipeline_worker(rank: int, world: int) -> bytes:
    """Every case, one after the other, in one set of ranks (starting ranks costs more than the cases).
    The cases without FSDP run on the pipeline of dp_shard rank 0 only; the others wait."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", "dp_shard"))
    first_pipeline = mesh["dp_shard"].get_local_rank() == 0
    results = {
        name: _train_pipeline(mesh, *case) for name, case in CASES.items() if case[-1] or first_pipeline
    }
    if first_pipeline:
        results["accumulated"] = _accumulate_two_steps(mesh)
    # As bytes: many tensors returned through the queue would travel as shared-memory handles that
    # need the rank process alive while the parent unpickles them.
    buffer = io.BytesIO()
    torch.save(results, buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def pipeline_runs() -> list[dict]:
    return [torch.load(io.BytesIO(r)) for r in run_ranks(_pipeline_worker, WORLD)]


def _check(runs: list[dict], name: str) -> None:
    schedule, vpp, layers, arch, packed, microbatches, _, _ = CASES[name]
    profile = _profile(schedule, vpp, layers, microbatches)
    ref = _reference(layers, arch, packed, profile)
    ranks = [rank for rank, run in enumerate(runs) if name in run]
    assert len(ranks) == (WORLD if CASES[name][-1] else 2)
    results = [runs[rank][name] for rank in ranks]
    for rank, res in zip(ranks, results, strict=True):
        # every rank reports the whole step's loss, per-sample losses and gradient norm
        assert res["losses"] == pytest.approx(ref["losses"], rel=RTOL)
        assert res["norms"] == pytest.approx(ref["norms"], rel=RTOL)
        torch.testing.assert_close(res["per_sample"], ref["per_sample"], rtol=RTOL, atol=ATOL)
        assert res["losses"][0] == pytest.approx(ref["loop_loss"], rel=1e-6)
        pp_rank = rank // (WORLD // 2)
        assert res["stage_ids"] == [pp_rank + 2 * v for v in range(vpp)]
    seen = set()
    for res in results:
        for grads, params in zip(res["grads"], res["params"], strict=True):
            for name, grad in grads.items():
                torch.testing.assert_close(
                    grad, ref["grads"][name], rtol=RTOL, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}"
                )
                torch.testing.assert_close(
                    params[name],
                    ref["params"][name],
                    rtol=RTOL,
                    atol=ATOL,
                    msg=lambda m, name=name: f"{name}: {m}",
                )
                seen.add(name)
    assert seen == set(ref["grads"]), "the stages together hold every parameter"
    # not vacuous: every block got a gradient, and training moved the loss
    assert all(ref["grads"][n].abs().sum() > 0 for n in ref["grads"] if n.startswith("blocks."))
    assert len(set(ref["losses"])) == STEPS


def test_gpipe_matches_one_process(pipeline_runs):
    _check(pipeline_runs, "gpipe")


def test_1f1b_four_micro_batches_matches_one_process(pipeline_runs):
    """ST-DiT blocks, pp_microbatches=4 (micro-batches of one sample)."""
    _check(pipeline_runs, "1f1b")


def test_interleaved_1f1b_vpp2_matches_one_process(pipeline_runs):
    """pp=2, vpp=2: four stages of one block each, rank 0 holding stages 0 and 2."""
    _check(pipeline_runs, "interleaved")


def test_packed_rows_one_per_micro_batch_match_gradient_accumulation(pipeline_runs):
    """Two packed rows of different lengths (padded to the token budget between stages)."""
    _check(pipeline_runs, "packed")


def test_whole_batch_split_by_the_schedule_matches_one_process(pipeline_runs):
    """The fallback for torch without pre-split micro-batches: the schedule splits the whole batch."""
    _check(pipeline_runs, "whole_batch")


def test_interleaved_1f1b_with_fsdp_on_each_stage_matches_one_process(pipeline_runs):
    """pp=2 x dp_shard=2: the stage modules sharded by FSDP2 after the split (DTensor gradients in the
    replicated-gradient sum and the clipped norm)."""
    _check(pipeline_runs, "interleaved_fsdp")


def test_two_steps_accumulate_gradients_like_two_backwards(pipeline_runs):
    """Gradient accumulation over pipeline steps: the conditioning gradients summed over the stages
    count each step once (the sum adds only a step's own contributions to what .grad held)."""
    model = _model(4, "dit").train()
    profile = _profile("interleaved-1f1b", 2, 4)
    edm = build_objective(profile.diffusion)
    torch.manual_seed(5)
    for _ in range(2):
        _edm_loss64(model, edm, _batches(False), profile.diffusion.caption_dropout)[0].backward()
    seen = set()
    for run in pipeline_runs:
        for grads in run.get("accumulated", []):
            for name, grad in grads.items():
                torch.testing.assert_close(grad, model.get_parameter(name).grad, rtol=RTOL, atol=ATOL)
                seen.add(name)
    assert seen == {n for n, _ in model.named_parameters()}
