"""Context parallel (all-gather, ring, Ulysses) on 2 and 4 gloo ranks against one process.

Every rank builds the same tiny float64 DiT and the same micro-batch, runs the EDM training loss of the
single-process model as the reference, then of the context-parallel copy on its share of the tokens
(`TokenShard`), for a packed row whose samples do not divide by the cp degree (so pads are exercised)
and for plain batches with and without pads. Checked: the gathered denoised output equals the single-process one, the
ranks' `shard_loss` shares sum to the single-process mean loss, and every parameter's gradient,
summed over the ranks, equals the single-process gradient. float64 throughout: the two computations
differ in summation order only, so 1e-10 (relative and absolute) bounds rounding with a wide margin and
catches any real error (a missing key or a wrong gradient path is O(1e-2); a 0.1% error in one ring
gradient term showed as 1e-4). Context-parallel sampling (several denoising steps
with classifier-free guidance) must give the single-process latents: the sampler runs in float32, so
there the tolerance is 1e-5.

One spawn of 4 ranks runs every case, the 2-rank ones on the cp groups {0, 1} and {2, 3} of a
(dp 2, cp 2) mesh, the 4-rank ones on the world, and the tests read its results: on this 2-core machine
process start-up costs more than the cases.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402
from usp_cases import ATTENTION_ROWS, usp_cases  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

IMPLS = ("all-gather", "ring", "ulysses")
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _model():
    from vidforge.models import build_model, model_config

    cfg = model_config(
        "tiny", hidden=32, heads=4, layers=2, mlp_hidden=64, patch=[1, 1, 1], adaln_lora_rank=4
    )
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the zero initialisation, so every parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


ROWS = ("packed", "plain", "plain padded")


def _inputs(row_kind: str):
    """A micro-batch in row order: clean tokens, noise, per-sample sigma, text, text mask, caption
    dropout, and the `layout` (packed) or `grid` (plain batch) of the row."""
    packed = row_kind == "packed"
    from vidforge.models import pack_latents, patchify

    g = torch.Generator().manual_seed(2)
    if packed:  # 12 + 3 + 9 tokens: 3 and 9 leave pads at cp 2 and 4
        shapes = [(4, 2, 2, 3), (4, 1, 1, 3), (4, 3, 1, 3)]
        latents = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
        clean, layout = pack_latents(latents, (1, 1, 1))
        row = {"layout": layout}
    else:  # two clips of 2 x 2 x 3 = 12 tokens (no pads on 2 or 4 ranks), or 3 x 1 x 3 = 9 (pads)
        grid = (2, 2, 3) if row_kind == "plain" else (3, 1, 3)
        latents = torch.randn(2, 4, *grid, generator=g, dtype=torch.float64)
        clean, row = patchify(latents, (1, 1, 1)), {"grid": grid}
    n = 3 if packed else 2
    noise = torch.randn(clean.shape, generator=g, dtype=torch.float64)
    sigma = torch.rand(n, generator=g, dtype=torch.float64) * 2 + 0.1
    text = torch.randn(n, 5, 32, generator=g, dtype=torch.float64)
    text_mask = torch.ones(n, 5, dtype=torch.bool)
    text_mask[0, 3:] = False
    drop = torch.zeros(n, dtype=torch.bool)
    drop[-1] = True  # one sample uses the null caption
    return clean, noise, sigma, (text, text_mask), drop, row


def _edm_loss(model, clean, noise, sigma, sigma_b, text, drop, **row):
    """The EDM loss written out: noise, denoise with the preconditioned model, weighted per-element loss
    (the training step's `DenoisingLoss` is the same loss on the raw output)."""
    from vidforge.diffusion import EDM

    edm = EDM()

    def network(x_in, c_noise):
        return model(x_in, c_noise, *text, drop_text=drop, **row)

    denoised = edm.denoise(network, clean + sigma_b * noise, sigma, sigma_b)
    return denoised, edm.loss_weight(sigma_b) * (denoised - clean) ** 2


def _case(model, impl: str, row_kind: str, group, regather: bool = False) -> dict[str, float]:
    """Largest errors of the cp run against the single-process one: denoised output, loss, gradients.
    The cp side is the recipe for the training step: split the row's tensors with the shard, sigma per
    local token, `shard_loss` as the rank's share of the mean."""
    import torch.distributed as dist

    from vidforge.parallel.context_parallel import (
        apply_cp,
        cp_process_group,
        gather_row,
        per_token,
        shard_loss,
        shard_of,
    )

    clean, noise, sigma, text, drop, row = _inputs(row_kind)
    reference = copy.deepcopy(model)
    sigma_b = row["layout"].per_token(sigma)[..., None] if "layout" in row else sigma[:, None, None]
    out, elementwise = _edm_loss(reference, clean, noise, sigma, sigma_b, text, drop, **row)
    loss = elementwise.mean()
    loss.backward()

    # A copy of a cp model (EMA, evaluation) shares its process group and computes the same.
    cp_model = copy.deepcopy(apply_cp(copy.deepcopy(model), group, impl, regather))
    shard = shard_of(row.get("layout") or row.get("grid"), group)
    local, local_elementwise = _edm_loss(
        cp_model,
        shard.split(clean),
        shard.split(noise),
        sigma,
        per_token(sigma, shard),
        text,
        drop,
        shard=shard,
    )
    share = shard_loss(local_elementwise, shard)
    share.backward()
    total = share.detach().clone()
    group = cp_process_group(group)
    dist.all_reduce(total, group=group)
    errors = {
        "output": (gather_row(local.detach(), shard, group) - out.detach()).abs().max().item(),
        "loss": (total - loss.detach()).abs().item(),
        "grad": 0.0,
        "grad_scale": max(p.grad.abs().max().item() for p in reference.parameters()),
    }
    for p, q in zip(cp_model.parameters(), reference.parameters(), strict=True):
        grad = p.grad.clone()
        dist.all_reduce(grad, group=group)
        errors["grad"] = max(errors["grad"], (grad - q.grad).abs().max().item())
    return errors


def _sampling(model, impl: str, group, cfg_group=None) -> dict[str, float]:
    """Largest difference between context-parallel and single-process sampled latents, with the null
    caption and with a negative prompt as the unconditional branch."""
    from vidforge.parallel.context_parallel import apply_cp
    from vidforge.profile import load_profile
    from vidforge.sampling.latents import sample_latents, sample_latents_cp

    profile = load_profile(None, ["diffusion.steps=3", "diffusion.guidance=2.0", "diffusion.sampler=heun"])
    g = torch.Generator().manual_seed(3)
    text = torch.randn(2, 4, 32, generator=g)
    text_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    shape = (4, 3, 1, 3)  # 9 tokens: padded on 2 and 4 ranks
    negative = (torch.randn(1, 6, 32, generator=g), torch.tensor([[1, 1, 1, 0, 0, 0]], dtype=torch.bool))
    cp_model = apply_cp(copy.deepcopy(model), group, impl)
    errors = {}
    for name, neg in (("null caption", None), ("negative prompt", negative)):
        single = sample_latents(model, profile, text, text_mask, [5, 6], shape, neg)
        cp = sample_latents_cp(
            cp_model, profile, text, text_mask, [5, 6], shape, group, neg, cfg_group=cfg_group
        )
        assert cp.shape == single.shape == (2, *shape)
        errors[name] = (cp - single).abs().max().item()
    return errors


def _fsdp_checkpointed(model, mesh) -> dict[str, float]:
    """The training composition: ring cp attention, every block checkpointed (recomputed in the
    backward, collectives included), FSDP2 over the cp ranks (dp_shard_cp = cp here) reducing the
    gradients. FSDP averages over its ranks, so the loss backpropagated is cp x `shard_loss`."""
    from vidforge.memory_savers.activation_checkpoint import apply_activation_checkpointing
    from vidforge.parallel.context_parallel import apply_cp, per_token, shard_loss, shard_of
    from vidforge.parallel.fsdp import apply_fsdp

    clean, noise, sigma, text, drop, row = _inputs("packed")
    reference = copy.deepcopy(model)
    sigma_b = row["layout"].per_token(sigma)[..., None]
    _, elementwise = _edm_loss(reference, clean, noise, sigma, sigma_b, text, drop, **row)
    elementwise.mean().backward()

    cp_model = apply_cp(copy.deepcopy(model), mesh, "ring")
    apply_activation_checkpointing(cp_model.blocks, "full")
    apply_fsdp(cp_model, mesh, cp_model.blocks, param_dtype=torch.float64, reduce_dtype=torch.float64)
    shard = shard_of(row["layout"], mesh)
    _, local = _edm_loss(
        cp_model,
        shard.split(clean),
        shard.split(noise),
        sigma,
        per_token(sigma, shard),
        text,
        drop,
        shard=shard,
    )
    (shard.size * shard_loss(local, shard)).backward()
    grads = {name: p.grad.full_tensor() for name, p in cp_model.named_parameters()}
    errors = {"grad": 0.0, "grad_scale": 0.0, "output": 0.0, "loss": 0.0}
    for name, p in reference.named_parameters():
        mine = grads[name] if name in grads else grads[_wrapped(name)]
        errors["grad"] = max(errors["grad"], (mine - p.grad).abs().max().item())
        errors["grad_scale"] = max(errors["grad_scale"], p.grad.abs().max().item())
    return errors


def _wrapped(name: str) -> str:
    """A parameter's name inside a checkpoint-wrapped block."""
    prefix, index, rest = name.split(".", 2)
    return f"{prefix}.{index}._checkpoint_wrapped_module.{rest}"


def _chunked_ring(group) -> float:
    """Ring attention a few queries at a time (what bounds its memory on long rows) against one
    process's attention over the whole packed row: largest error of the outputs and of the q, k, v
    gradients (each rank's own rows: the ring brings every key gradient home)."""
    from vidforge.attention.dispatch import attention
    from vidforge.models import SequenceLayout
    from vidforge.parallel.context_parallel import cp_process_group, shard_of
    from vidforge.parallel.cp_attention import ring_attention

    group = cp_process_group(group)

    layout = SequenceLayout(((2, 2, 3), (1, 1, 3), (3, 1, 3)))
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, layout.total, 2, 6, generator=g, dtype=torch.float64) for _ in range(3))
    weight = torch.randn(1, layout.total, 2, 6, generator=g, dtype=torch.float64)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    (attention(*full, layout.segments(), "dense") * weight).sum().backward()
    shard = shard_of(layout, group)
    local = [shard.split(t).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, shard, group, "dense", query_chunk=3)  # query chunks: the einsum path
    (out * shard.split(weight)).sum().backward()
    reference = shard.split(attention(q, k, v, layout.segments(), "dense"))
    valid = shard.valid()
    errors = [(out - reference)[:, valid].abs().max().item()]
    errors += [
        (mine.grad - shard.split(ref.grad)).abs().max().item() for mine, ref in zip(local, full, strict=True)
    ]
    return max(errors)


def _regather_saving(group) -> tuple[int, float]:
    """Bytes one all-gather attention call keeps for the backward, without re-gather minus with it
    (measured from what autograd saves), beside the memory model's "gathered keys/values" part for the
    same shapes: (cp - 1) / cp of the row's K and V."""
    import torch.distributed as dist

    from vidforge.bench.measure import saved_activations
    from vidforge.estimate.memory_model import gathered_kv_bytes
    from vidforge.models import model_config
    from vidforge.parallel.context_parallel import cp_process_group
    from vidforge.parallel.cp_attention import all_gather_attention
    from vidforge.tokens import TokenShard

    group = cp_process_group(group)
    size = dist.get_world_size(group)
    shard = TokenShard.of_grid((4, 4, 4), dist.get_rank(group), size)
    heads, dim = 4, 8
    leaf = torch.randn(3, 1, shard.local, heads, dim, requires_grad=True)
    kept = []
    for regather in (False, True):
        q, k, v = leaf * 1  # activations, as a block's q/k/v are
        with saved_activations(torch.nn.Module()) as saved:
            out = all_gather_attention(q, k, v, shard, group, regather=regather)
        kept.append(saved.bytes)
        out.sum().backward()  # the re-gather's collective runs here, on every rank
    cfg = model_config("tiny", hidden=heads * dim, heads=heads)
    return kept[0] - kept[1], gathered_kv_bytes(cfg, shard.local * (size - 1), 4)


def _fused_ring(group) -> dict:
    """Ring attention with each block through the fused CPU flash kernel (model.attention=sdpa) and
    through the einsum reference (dense, 3 queries at a time), against one process's dense attention
    over the whole row: for each row kind, the largest error of the output (real tokens) and of the q,
    k, v gradients (this rank's rows) of either ring, and between the two rings."""
    from vidforge.attention.dispatch import attention
    from vidforge.models import SequenceLayout
    from vidforge.parallel.context_parallel import cp_process_group, shard_of
    from vidforge.parallel.cp_attention import ring_attention

    group = cp_process_group(group)
    rows = {  # (layout or grid, batch): pads at cp 2 and 4 in all but "plain"
        "packed": (SequenceLayout(((2, 2, 3), (1, 1, 3), (3, 1, 3))), 1),
        "plain": ((2, 2, 3), 2),
        "plain padded": ((3, 1, 3), 2),
    }
    errors = {}
    for kind, (row, batch) in rows.items():
        layout = row if isinstance(row, SequenceLayout) else SequenceLayout((row,))
        segments = layout.segments() if isinstance(row, SequenceLayout) else None
        g = torch.Generator().manual_seed(5)
        q, k, v, weight = (
            torch.randn(batch, layout.total, 2, 6, generator=g, dtype=torch.float64) for _ in range(4)
        )
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        reference = attention(*full, segments, "dense")
        (reference * weight).sum().backward()
        shard = shard_of(row, group)
        valid = shard.valid()
        results = {}
        for backend in ("sdpa", "dense"):
            local = [shard.split(t).requires_grad_() for t in (q, k, v)]
            out = ring_attention(*local, shard, group, backend, query_chunk=3)
            (out * shard.split(weight)).sum().backward()
            results[backend] = [out.detach()[:, valid]] + [t.grad for t in local]
        wanted = [shard.split(reference.detach())[:, valid]] + [shard.split(t.grad) for t in full]
        for name, (a, b) in {
            "fused": ("sdpa", None),
            "einsum": ("dense", None),
            "fused vs einsum": ("sdpa", "dense"),
        }.items():
            other = wanted if b is None else results[b]
            errors[(name, kind)] = max(
                (x - y).abs().max().item() for x, y in zip(results[a], other, strict=True)
            )
        errors[("scale", kind)] = min(t.grad.abs().max().item() for t in full)
    return errors


def _bench_cp(group) -> dict:
    """`vidforge bench attention`'s context-parallel rows on this group (a 32-token row, one timed call):
    each implementation's row."""
    from vidforge.bench.attention_bench import CP_IMPLS, AttentionRow, measure_cp
    from vidforge.parallel.context_parallel import cp_process_group
    from vidforge.profile import load_profile

    profile = load_profile(None, ["bench.warmup=0", "bench.repeats=1"])
    group = cp_process_group(group)
    return {
        impl: measure_cp(AttentionRow(impl, 32), profile, group, torch.device("cpu"), torch.float32).as_dict()
        for impl in CP_IMPLS
    }


def _worker(rank: int, world: int):
    """Every case on a (dp 2, cp 2) mesh, each pair of ranks a cp group (group ranks are not global
    ranks on the second pair), then the 4-rank cases on the whole world."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))
    cp2 = mesh["cp"]
    model = _model()
    two = {"chunked ring": _chunked_ring(cp2), "fsdp": _fsdp_checkpointed(model, cp2)}
    for impl in IMPLS:
        for kind in ROWS:
            two[(impl, kind)] = _case(model, impl, kind, cp2)
    for kind in ROWS:  # NeMo's variant: only the local K/V kept, gathered again in the backward
        two[("all-gather regather", kind)] = _case(model, "all-gather", kind, cp2, regather=True)
    two["regather saving"] = _regather_saving(cp2)
    # Sliding-tile attention under re-gather: here, where the selective checkpointing is loaded already.
    from test_sliding_tile_cp import ROWS as TILE_ROWS
    from test_sliding_tile_cp import attention_case

    two["tiles regather"] = {kind: attention_case(kind, "all-gather regather", cp2) for kind in TILE_ROWS}
    two["sampling"] = _sampling(model, "ring", cp2)
    two["cfg sampling"] = _sampling(model, "all-gather", cp2, cfg_group=mesh["dp"])  # dp ranks as cfg
    two["fused ring"] = _fused_ring(cp2)
    two["bench cp"] = _bench_cp(cp2)
    four = {"chunked ring": _chunked_ring(dist.group.WORLD)}
    four["fused ring"] = _fused_ring(dist.group.WORLD)
    for impl in ("ring", "ulysses"):
        for kind in ROWS:
            four[(impl, kind)] = _case(model, impl, kind, dist.group.WORLD)
    four["usp"] = usp_cases()  # 2D context parallel: tests/distributed/usp_cases.py
    return {2: two, 4: four}


@pytest.fixture(scope="module")
def results():
    """Each rank's results, run once: one spawn of 4 processes (start-up dominates on this machine)."""
    return run_ranks(_worker, 4)


@pytest.fixture(scope="module")
def two_ranks(results):
    return [r[2] for r in results]


@pytest.fixture(scope="module")
def four_ranks(results):
    return [r[4] for r in results]


def _check(errors):
    assert errors["output"] < TOL["atol"]
    assert errors["loss"] < TOL["atol"]
    assert errors["grad"] < TOL["atol"] + TOL["rtol"] * errors["grad_scale"]
    assert errors["grad_scale"] > 1e-3  # the gradients compared are not trivially zero


@pytest.mark.parametrize("kind", ROWS)
@pytest.mark.parametrize("impl", [*IMPLS, "all-gather regather"])
def test_two_ranks_match_one_process(two_ranks, impl, kind):
    """Output, loss and parameter gradients of 2-rank context parallel equal the single process."""
    for rank_errors in two_ranks:
        _check(rank_errors[(impl, kind)])


@pytest.mark.parametrize("kind", ROWS)
@pytest.mark.parametrize("impl", ["ring", "ulysses"])
def test_four_ranks_match_one_process(four_ranks, impl, kind):
    """4 ranks equal the single process: the ring's blocks and gradient accumulators make a full turn
    through distinct neighbours (with 2 ranks the next rank is the previous one), Ulysses runs one head
    per rank, and a 3-token sample leaves one rank only a pad of it."""
    for rank_errors in four_ranks:
        _check(rank_errors[(impl, kind)])


def test_fsdp_and_checkpointing_with_cp_match_one_process(two_ranks):
    """Ring cp under full activation checkpointing and FSDP2 over the cp ranks, backpropagating cp x
    shard_loss: the reduced (full) gradients equal the single process's."""
    for rank_errors in two_ranks:
        _check(rank_errors["fsdp"])


def test_ring_in_query_chunks_matches_one_process(two_ranks, four_ranks):
    """Ring attention computed a few queries at a time: outputs and q/k/v gradients equal one process's
    attention over the whole packed row (float64, 1e-10)."""
    for rank_errors in [*two_ranks, *four_ranks]:
        assert rank_errors["chunked ring"] < TOL["atol"]


def test_context_parallel_sampling_matches_one_process(two_ranks):
    """Heun sampling with guidance (null caption or negative prompt), the latent tokens split over 2
    ranks at every step and gathered at the end, gives the single-process latents (float32 sampler
    state: 1e-5)."""
    for rank_errors in two_ranks:
        assert rank_errors["sampling"]["null caption"] < 1e-5
        assert rank_errors["sampling"]["negative prompt"] < 1e-5


def test_cfg_parallel_with_context_parallel_sampling_matches_one_process(two_ranks):
    """The same on 4 ranks: guidance branches on two ranks (CFG-parallel), each splitting the tokens
    over two cp ranks."""
    for rank_errors in two_ranks:
        assert rank_errors["cfg sampling"]["null caption"] < 1e-5
        assert rank_errors["cfg sampling"]["negative prompt"] < 1e-5


@pytest.mark.parametrize("kind", ["plain", "packed"])
def test_sliding_tile_attention_under_regather_equals_the_dense_masked_reference(two_ranks, kind):
    """test_sliding_tile_cp's attention case under all-gather with re-gather (its recompute replays the
    forward with the windows' mask built before it): output and q, k, v gradients, float64."""
    from test_sliding_tile_cp import reference

    want = reference(kind)
    for rank_results in two_ranks:
        got = rank_results["tiles regather"][kind]
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, **TOL, msg=f"{name} differs")


def test_regather_saves_what_the_memory_model_says(two_ranks):
    """All-gather CP with re-gather keeps (cp - 1) / cp less of the row's K/V, as the memory model counts."""
    for rank_results in two_ranks:
        measured, predicted = rank_results["regather saving"]
        assert measured > 0
        assert predicted == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize("kind", ROWS)
@pytest.mark.parametrize("ring", ["fused", "einsum", "fused vs einsum"])
def test_fused_ring_equals_einsum_ring_and_one_process(two_ranks, four_ranks, ring, kind):
    """Ring attention whose blocks run through the fused CPU flash kernel (returning the log-sum-exp
    the merge uses) gives the einsum ring's and one process's outputs and q, k, v gradients, on 2 and 4
    ranks, for packed rows (samples with no token on some rank) and plain batches with and without pads
    (float64: 1e-10)."""
    for rank_results in [*two_ranks, *four_ranks]:
        errors = rank_results["fused ring"]
        assert errors[(ring, kind)] < TOL["atol"]
        assert errors[("scale", kind)] > 1e-3  # the gradients compared are not trivially zero


def test_bench_attention_times_every_cp_implementation(two_ranks):
    """bench attention's rows under 2 ranks: ring (fused), the einsum ring, all-gather and Ulysses each
    timed forward and forward + backward, the same slowest-rank time reported on every rank, and the
    rate that of the whole 32-token row's attention."""
    from vidforge.bench.attention_bench import attention_flops
    from vidforge.profile import load_profile

    model = load_profile(None).model
    for impl in ("ring", "ring-einsum", "all-gather", "ulysses"):
        rows = [rank_results["bench cp"][impl] for rank_results in two_ranks]
        for row in rows:
            assert row["skipped"] is None and row["forward_s"] > 0 and row["forward_backward_s"] > 0
            flops = attention_flops(32, model.heads, model.head_dim)
            assert row["forward_tflops"] == pytest.approx(flops / row["forward_s"] / 1e12)
        # each cp pair reduces to its slowest rank
        assert rows[0]["forward_backward_s"] == rows[1]["forward_backward_s"]
        assert rows[2]["forward_backward_s"] == rows[3]["forward_backward_s"]


# --- 2D context parallel (cp_impl=usp, ulysses 2 x ring 2): the cases of usp_cases.py -------------------


@pytest.mark.parametrize("kind", ATTENTION_ROWS)
def test_usp_attention_equals_attention_forward_and_grads(four_ranks, kind):
    """ulysses2 x ring2 attention of a row split over 4 ranks equals softmax attention over the whole
    row: outputs and the gradients of q, k and v, on packed rows and padded plain batches."""
    for rank_errors in four_ranks:
        errors = rank_errors["usp"][("attention", kind)]
        assert errors["grad_scale"] > 1e-3
        assert max(v for name, v in errors.items() if name != "grad_scale") < TOL["atol"], errors


@pytest.mark.parametrize("kind", ROWS)
def test_usp_dit_loss_and_gradients_equal_one_process(four_ranks, kind):
    """Output, loss share and parameter gradients of the DiT under ulysses2 x ring2 equal one process."""
    for rank_errors in four_ranks:
        _check(rank_errors["usp"][("model", kind)])
