"""2D context parallel's cases (parallel.cp_impl=usp: Ulysses 2 inside, ring 2 across) on 4 gloo ranks
against one process, with the groups `ParallelDims.cp_2d_groups` makes. They run in
test_context_parallel.py's 4-rank spawn (process start-up costs more than the cases on this machine),
whose tests check them:

- the attention alone: random float64 q, k, v of a packed row whose samples leave pads at cp 4 (12 + 3 +
  9 + 5 tokens) and of a plain batch with pads (2 rows of 9), against softmax attention written out per
  sample; forward and the gradients of q, k and v;
- a tiny DiT's EDM loss, through test_context_parallel's `_case` (output, loss share, every parameter's
  gradient, for packed rows and plain batches with and without pads).

float64: the computations differ in summation order only, so 1e-10 bounds rounding."""

from __future__ import annotations

import torch

HEADS, DIM = 4, 8
ATTENTION_ROWS = {"packed": [12, 3, 9, 5], "plain padded": [9]}


def _reference_attention(q, k, v, lengths):
    """Full attention inside each sample, written out: softmax(q k^T / sqrt(d)) v."""
    outs, start = [], 0
    for n in lengths:
        qs, ks, vs = (x[:, start : start + n] for x in (q, k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", qs, ks) / DIM**0.5
        outs.append(torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vs))
        start += n
    return torch.cat(outs, 1)


def _attention_case(kind: str, cp_mesh, groups) -> dict[str, float]:
    from vidforge.parallel.context_parallel import shard_of
    from vidforge.parallel.usp_attention import usp_attention
    from vidforge.tokens import SequenceLayout

    lengths = ATTENTION_ROWS[kind]
    batch = 1 if kind == "packed" else 2
    g = torch.Generator().manual_seed(3)
    q, k, v, weight = (
        torch.randn(batch, sum(lengths), HEADS, DIM, generator=g, dtype=torch.float64) for _ in range(4)
    )
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    out = _reference_attention(*full, lengths)
    (out * weight).sum().backward()

    row = SequenceLayout(tuple((n, 1, 1) for n in lengths)) if kind == "packed" else (lengths[0], 1, 1)
    shard = shard_of(row, cp_mesh)
    local = [shard.split(x).requires_grad_() for x in (q, k, v)]
    local_out = usp_attention(*local, shard, cp_mesh.get_group(), groups=groups)
    (local_out * shard.split(weight)).sum().backward()  # pads weigh 0: their outputs are meaningless
    valid = shard.valid()
    errors = {"output": (local_out - shard.split(out))[:, valid].abs().max().item()}
    for name, mine, reference in zip("qkv", local, full, strict=True):
        errors[f"grad {name}"] = (mine.grad - shard.split(reference.grad)).abs().max().item()
    errors["grad_scale"] = min(x.grad.abs().max().item() for x in full)
    return errors


def usp_cases() -> dict:
    """Every case on this rank: ("attention", row kind) -> errors, ("model", row kind) -> errors."""
    from test_context_parallel import ROWS, _case, _model

    from vidforge.parallel.context_parallel import apply_cp
    from vidforge.parallel.dims import ParallelDims
    from vidforge.parallel.usp_attention import UspGroups
    from vidforge.profile.parallel import Layout

    dims = ParallelDims(Layout(pp=1, dp_replicate=1, dp_shard=1, cp=4, tp=1))
    groups = UspGroups(*dims.cp_2d_groups(2))
    cp_mesh = dims.mesh["cp"]
    results = {("attention", kind): _attention_case(kind, cp_mesh, groups) for kind in ATTENTION_ROWS}
    # The model with usp installed first; the case's own apply_cp then finds it installed and keeps it.
    model = apply_cp(_model(), cp_mesh, "usp", usp_groups=groups)
    for kind in ROWS:
        results[("model", kind)] = _case(model, "usp", kind, cp_mesh)
    return results
