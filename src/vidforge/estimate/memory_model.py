"""Analytic memory of one training rank for a profile's layout: parameters, gradients, optimizer states,
EMA, activations (with or without activation checkpointing), the compute-dtype weight copies autograd
keeps, and communication buffers. Every term carries the arithmetic that produced it, so a plan can be
read and checked by hand.

Activations are read off the family's network (`vidforge.estimate.module_costs`): what one block saves
for its backward (one tensor-parallel rank's shard of it, on the rank's tokens, trained or a LoRA's
frozen base with its adapters), and what lives outside the blocks (the model's inputs, the embedders,
the output layer, the conditioning every block reads), by saved-tensor hooks on a meta-device forward;
+ the objective's float32 error (4 x patch_dim per token) the loss keeps.

Layouts (mesh pp x dp_replicate x dp_shard x cp x tp): FSDP shards parameters, gradients, optimizer and
EMA over dp_shard x cp (context-parallel ranks hold the same weights); tensor parallel splits the
attention and MLP matrices and every per-token term by tp (with sequence parallel, also the norms and
residuals; without it those stay whole); context parallel divides the tokens by cp, and its all-gather
implementation also keeps the gathered keys and values of every full-attention layer; pipeline
parallel keeps layers / pp blocks per stage and, under 1F1B, pp micro-batches in flight on the first
stage (all micro-batches under GPipe)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vidforge.estimate.module_costs import saved_per_rank
from vidforge.estimate.param_counts import (
    ParameterCounts,
    lora_adapted,
    lora_parameters,
    parameter_counts,
    tp_local_parameters,
)
from vidforge.estimate.workload import Workload
from vidforge.families import family
from vidforge.profile import RunProfile
from vidforge.profile.layout_rules import sequence_parallel
from vidforge.profile.model import Model
from vidforge.profile.parallel import Layout

GIB = 2**30
ADAM_STATES = 2  # exp_avg, exp_avg_sq (float32 each)


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    formula: str
    """How the number was computed, in words and numbers."""


@dataclass
class MemoryEstimate:
    """Per-rank device memory of one training step, term by term (bytes)."""

    terms: list[Term]
    notes: list[str] = field(default_factory=list)
    offloaded_bytes: float = 0.0
    """What train.activation_offload sends to host memory and back a micro-batch (the planner's copy time)."""
    host_bytes: float = 0.0
    """Frozen weights block swap keeps in host memory."""
    offloaded_inputs: int = 0
    """Of what is offloaded: how many checkpointed blocks' inputs (train.checkpoint_offload)..."""
    offloaded_input_bytes: float = 0.0
    """...and their bytes."""

    def get(self, name: str) -> float:
        return sum(t.bytes for t in self.terms if t.name == name)

    @property
    def total(self) -> float:
        return sum(t.bytes for t in self.terms)

    @property
    def state(self) -> float:
        """Parameters, gradients, optimizer and EMA: what lives across steps."""
        return sum(self.get(n) for n in ("parameters", "gradients", "optimizer", "ema"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_bytes": self.total,
            "total_gib": self.total / GIB,
            "terms": [asdict(t) for t in self.terms],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Precision:
    compute: int
    """Bytes per element of activations and of the weight copies the matmuls read."""
    autocast: bool
    """One process in bf16: fp32 weights, autocast keeps a bf16 copy of every Linear weight."""
    fsdp: bool
    """Weights sharded by FSDP2 (mixed precision: unsharded copies in the compute dtype)."""


def precision_of(profile: RunProfile, layout: Layout) -> Precision:
    bf16 = profile.train.precision == "bf16"
    fsdp = layout.dp_shard * layout.cp > 1 or layout.dp_replicate > 1
    return Precision(compute=2 if bf16 else 4, autocast=bf16 and not fsdp, fsdp=fsdp)


def _gib(n: float) -> str:
    return f"{n / GIB:.3g} GiB"


@dataclass(frozen=True)
class BlockActivations:
    """Bytes one block saves for its backward, on one rank, by part."""

    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def gathered_kv_bytes(cfg: Model, gathered_tokens: float, compute: int, tp: int = 1) -> float:
    """Keys and values of `gathered_tokens` tokens of other context-parallel ranks that all-gather CP
    keeps for the backward in every full-attention scope of a block (this tp rank's heads)."""
    full_scopes = family(cfg.family).block_scopes(cfg)[0].count("full")
    return full_scopes * 2 * gathered_tokens * cfg.hidden * compute / tp


TEXT_STREAM = ("cross_attn.k", "cross_attn.v", "attn2.to_k", "attn2.to_v")
"""Linear layers of a block that read the caption's tokens (the rest read the video's)."""
IMAGE_STREAM = ("attn2.add_k_proj", "attn2.add_v_proj")
PER_SAMPLE = ("modulation.proj",)
ROW_PARALLEL = (".out", "to_out.0", "fc2", "net.2")
"""Tensor parallel's row-parallel layers: their matmul's output is whole (a partial sum) on every rank."""


def op_level_block(
    cfg: Model,
    tokens: float,
    samples: int,
    text_tokens: int,
    compute: int,
    *,
    tp: int = 1,
    image_tokens: int = 0,
    lora_rank: int = 0,
    adapted: frozenset[str] = frozenset(),
) -> float | None:
    """Bytes an op-level checkpointed block (`vidforge.memory_savers.activation_checkpoint`, `ops`) keeps between
    its forward and its backward besides its input, for `tokens` tokens of this rank: the output of every
    matmul (each linear layer's, on the tokens it reads: the video's, the caption's, the image's, or one
    row a sample for the modulation; a LoRA adapter's two, rank and the layer's width) and of every
    attention kernel (its output and float32 log-sum-exp per query token), in the compute dtype. None
    where the block's joint attention (stdit_block=parallel-mm) is not modelled: no op level there."""
    if cfg.multimodal_block:
        return None
    from vidforge.estimate.param_counts import block_linears

    streams = {
        "video": tokens,
        "text": samples * text_tokens,
        "image": samples * image_tokens,
        "sample": samples,
    }
    total = 0.0
    for name, width in block_linears(cfg):
        if name.endswith(IMAGE_STREAM) and not image_tokens:
            continue
        stream = (
            "text" if name.endswith(TEXT_STREAM)
            else "image" if name.endswith(IMAGE_STREAM)
            else "sample" if name.endswith(PER_SAMPLE)
            else "video"
        )  # fmt: skip
        split = 1 if name.endswith(ROW_PARALLEL) else tp
        adapter = (lora_rank + width) if name in adapted else 0
        total += streams[stream] * (width / split + adapter) * compute
    scopes = len(family(cfg.family).block_scopes(cfg)[0])
    kernels = scopes + 1 + (1 if image_tokens else 0)  # self-attention scopes, cross-attention, image's
    total += kernels * tokens * (cfg.hidden * compute + 4 * cfg.heads) / tp
    return total


def in_flight_microbatches(layout: Layout, schedule: str) -> float:
    """Micro-batches whose activations the first pipeline stage holds at once."""
    if layout.pp == 1:
        return 1
    if schedule == "gpipe":
        return layout.pp_microbatches
    base = min(layout.pp, layout.pp_microbatches)
    if schedule == "interleaved-1f1b":
        return base * (1 + (layout.pp - 1) / (layout.pp * layout.vpp))
    return base


@dataclass
class _Rank:
    """What every term of one rank's estimate reads, and the terms and notes as they are added."""

    profile: RunProfile
    layout: Layout
    workload: Workload
    cfg: Model
    train: Any
    par: Any
    counts: ParameterCounts
    prec: Precision
    shards: int
    blocks: int
    tp: int
    sequence_parallel: bool
    """Whether tensor parallel also splits the sequence (`layout_rules.sequence_parallel`)."""
    block_params: float
    outside_params: float
    local_params: float
    terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    block_adapters: int = 0
    """LoRA: one block's adapter parameters (0 without LoRA)."""
    adapters: float = 0.0
    """LoRA: the adapter parameters this rank trains on the device."""
    host_bytes: float = 0.0


@dataclass(frozen=True)
class _Activations:
    """What the activation terms decided, for the weight copies, buffers and the backward's overlap."""

    tokens: int
    one: BlockActivations
    recomputed: int
    op_level: set[int]
    kept: int
    offloaded: list[int]
    stored: float
    in_flight: float
    inputs_offloaded: int
    block_input: float


def estimate_memory(
    profile: RunProfile, layout: Layout | None = None, workload: Workload | None = None
) -> MemoryEstimate:
    """Device memory of one rank of `layout` (default: the profile's) training on `workload` (default:
    the profile's bench sample, train.micro_batch clips per rank), term by term: the weights and their
    states, the activations, the weight copies held for the backward, the communication buffers, and the
    backward's overlap of activations and gradients."""
    layout = layout or profile.layout
    workload = workload or Workload.from_profile(profile)
    cfg = profile.model
    counts: ParameterCounts = parameter_counts(cfg)
    prec = precision_of(profile, layout)
    shards = layout.dp_shard * layout.cp if prec.fsdp else 1
    blocks, tp = cfg.layers // layout.pp, layout.tp
    r = _Rank(
        profile, layout, workload, cfg, profile.train, profile.parallel, counts, prec, shards, blocks, tp,
        sequence_parallel=sequence_parallel(profile),
        block_params=counts.block - counts.block_tp + counts.block_tp / tp,
        outside_params=counts.outside - counts.outside_tp + counts.outside_tp / tp,
        local_params=tp_local_parameters(counts, blocks, tp) / shards,
    )  # fmt: skip
    _state_terms(r)
    acts = _activation_terms(r)
    _weight_copy_terms(r, acts)
    _communication_terms(r, acts)
    _backward_overlap(r, acts)
    inputs_bytes = acts.in_flight * acts.inputs_offloaded * acts.block_input
    offloaded_bytes = acts.in_flight * len(acts.offloaded) * acts.one.total + inputs_bytes
    return MemoryEstimate(
        r.terms, r.notes, offloaded_bytes, r.host_bytes, acts.inputs_offloaded, inputs_bytes
    )


def _state_terms(r: _Rank) -> None:
    """Parameters, gradients, AdamW states and EMA of what trains (LoRA: the frozen base, with fp8 base and
    block swap, and the adapters), a distillation's fake score and teacher."""
    (
        profile,
        cfg,
        train,
        counts,
        prec,
        shards,
        blocks,
        tp,
        block_params,
        outside_params,
        local_params,
        terms,
        notes,
    ) = (
        r.profile,
        r.cfg,
        r.train,
        r.counts,
        r.prec,
        r.shards,
        r.blocks,
        r.tp,
        r.block_params,
        r.outside_params,
        r.local_params,
        r.terms,
        r.notes,
    )
    where = f"({outside_params:,.0f} outside the blocks + {blocks} blocks x {block_params:,.0f}"
    where += f"{' after TP/' + str(tp) if tp > 1 else ''}) / {shards} FSDP shard(s)"
    offload = train.fsdp_cpu_offload and prec.fsdp
    # LoRA (train.lora; the rulebook keeps it to tp = pp = 1): the base is frozen in the compute dtype and
    # has no gradients, optimizer states or EMA; the fp32 adapters have all four.
    block_adapters, adapters, host_bytes = 0, 0.0, 0.0
    if train.lora is not None:
        block_adapters, outside_adapters = lora_parameters(cfg, train.lora)
        adapters = (blocks * block_adapters + outside_adapters) / shards
        size, formula, host = lora_base(profile, counts, blocks, shards, where, local_params, prec.fsdp)
        terms.append(Term("parameters", 0.0 if offload else size, formula))
        if host:
            swapped = min(train.lora.blocks_to_swap, blocks)
            host_bytes = swapped * lora_block_bytes(profile, counts) / shards
            if prec.fsdp:
                # FSDP2 keeps a swapped block's whole shard on the host: its adapters too, with their
                # gradients, AdamW states and EMA (the optimizer steps them there)
                hosted = swapped * block_adapters / shards
                adapters -= hosted
                per = 4 + 4 + 4 * ADAM_STATES + (4 if train.ema_decay > 0 else 0)
                host_bytes += hosted * per
                host += (
                    f", and their {hosted:,.0f} adapter weights with gradients and AdamW states "
                    f"({_gib(hosted * per)})"
                )
            notes.append(host)
    trained = adapters if train.lora is not None else local_params
    state = [
        ("parameters", 4, "float32 master weights"),
        ("gradients", 4, "float32 gradients"),
        ("optimizer", 4 * ADAM_STATES, "AdamW exp_avg + exp_avg_sq, float32"),
    ]
    if train.ema_decay > 0:
        state.append(("ema", 4, "EMA of the weights, float32"))
    for name, per, what in state:
        size = 0.0 if offload else trained * per
        of = f"LoRA adapters / {shards} FSDP shard(s)" if train.lora is not None else where
        terms.append(Term(name, size, f"{what}: {of} = {trained:,.0f} params x {per} B = {_gib(size)}"))
    if train.distill is not None:
        # The fake score holds the model's weights and AdamW states again, no EMA, and no gradients at the
        # step's peak (they are freed after each of its updates, before the student's backward); the frozen
        # teacher holds its weights in the compute dtype.
        fake = sum(t.bytes for t in terms if t.name in ("parameters", "optimizer"))
        terms.append(
            Term(
                "fake score",
                fake,
                f"train.distill's fake score: the parameters and AdamW states again = {_gib(fake)}",
            )
        )
        teacher = local_params * prec.compute
        bound = " (an upper bound under fp8_teacher)" if train.distill.fp8_teacher else ""
        terms.append(
            Term(
                "teacher",
                teacher,
                f"train.distill's frozen teacher in the compute dtype: {where} = {local_params:,.0f} params x "
                f"{prec.compute} B = {_gib(teacher)}{bound}",
            )
        )
    if offload:
        notes.append(
            f"train.fsdp_cpu_offload: parameters, gradients and optimizer states ({_gib(local_params * 20)}) "
            "live in host memory"
        )

    r.block_adapters, r.adapters, r.host_bytes = block_adapters, adapters, host_bytes


def _activation_terms(r: _Rank) -> _Activations:
    """What the blocks save for the backward (per block policy: kept, op level, full recompute, offloaded),
    what lives outside them, and the backward's recompute workspace."""
    from vidforge.memory_savers.activation_checkpoint import FULL, OPS, block_policies
    from vidforge.memory_savers.activation_offload import offloaded_indices

    layout, workload, cfg, train, par, prec, blocks, tp, terms = (
        r.layout,
        r.workload,
        r.cfg,
        r.train,
        r.par,
        r.prec,
        r.blocks,
        r.tp,
        r.terms,
    )
    tokens = workload.tokens_per_rank(layout.cp, par.token_slicing)
    all_gather = layout.cp > 1 and par.cp_impl == "all-gather"
    gathered = tokens * (layout.cp - 1) if all_gather and not par.cp_regather else 0
    adapted = lora_adapted(cfg, train.lora) if train.lora is not None else frozenset()
    one, outside, shared = saved_activations(r, tokens, gathered)
    mode, ratio, ops_ratio = (
        train.activation_checkpointing,
        train.checkpoint_ratio,
        train.checkpoint_ops_ratio,
    )
    policies = block_policies(blocks, mode, ratio, ops_ratio)
    checkpointed = {i for i, p in enumerate(policies) if p == FULL}
    op_level = {i for i, p in enumerate(policies) if p == OPS}
    # train.activation_offload: these blocks (none of them recomputing) save theirs in host memory.
    offloaded = offloaded_indices(blocks, mode, ratio, train.activation_offload, ops_ratio)
    recomputed = len(checkpointed)
    kept = blocks - recomputed - len(op_level) - len(offloaded)
    in_flight = in_flight_microbatches(layout, par.pp_schedule)
    block_input = tokens * cfg.hidden * prec.compute / (tp if r.sequence_parallel else 1)
    # train.checkpoint_offload: the checkpointed blocks' inputs wait in host memory too
    inputs_offloaded = recomputed if train.checkpoint_offload else 0
    ops_kept = 0.0
    if op_level:
        ops_kept = (
            op_level_block(
                cfg,
                tokens,
                workload.samples,
                workload.text_tokens,
                prec.compute,
                tp=tp,
                image_tokens=workload.image_tokens,
                lora_rank=train.lora.rank if train.lora is not None else 0,
                adapted=adapted,
            )
            or 0.0
        )
    stored = kept * one.total + (recomputed - inputs_offloaded) * block_input
    stored += len(op_level) * (block_input + ops_kept)
    first_norm = 0.0
    first_free = policies and policies[0] == "none" and 0 not in offloaded and layout.pp == 1
    if train.lora is not None and first_free:
        # nothing before the first block trains: it keeps less (its first norm keeps no input)
        first_norm = one.total - saved_activations(r, tokens, gathered, first=True)[0].total
        stored -= first_norm
    if kept:  # saved by the blocks that keep theirs
        outside += shared
    else:  # no block saves it, the blocks' conditioning holds it for the recompute and backward
        terms.append(Term("shared conditioning", shared, "the caption's embedding, RoPE tables, timestep's"))
    acts = in_flight * stored + outside
    detail = ", ".join(f"{k} {_gib(v)}" for k, v in one.parts.items())
    formula = (
        f"{tokens:,.0f} tokens/rank ({workload.tokens:,} / cp {layout.cp}); one block saves {_gib(one.total)} "
        f"({detail}); {kept} blocks keep theirs"
    )
    if recomputed:
        formula += f", {recomputed} checkpointed blocks keep only their input ({_gib(block_input)} each)"
    if op_level:
        formula += (
            f", {len(op_level)} op-level checkpointed blocks keep their input and their matmul and attention "
            f"outputs ({_gib(block_input + ops_kept)} each)"
        )
    if inputs_offloaded:
        formula += ", in host memory (train.checkpoint_offload)"
    if first_norm:
        formula += (
            f"; the first block's first norm keeps no input (- {_gib(first_norm)}: nothing before it trains)"
        )
    if offloaded:
        formula += f", {len(offloaded)} offloaded blocks keep theirs in host memory"
    if in_flight != 1:
        formula += f"; x {in_flight:g} micro-batches in flight ({par.pp_schedule})"
    shared_here = ", the conditioning every block reads" if kept else ""
    formula += (
        f"; + {_gib(outside)} outside the blocks (the inputs, embedders and output layer{shared_here}, read off "
        "the network; the loss's float32 error)"
    )
    terms.append(Term("activations", acts, formula))
    done = _Activations(
        tokens=tokens,
        one=one,
        recomputed=recomputed,
        op_level=op_level,
        kept=kept,
        offloaded=offloaded,
        stored=stored,
        in_flight=in_flight,
        inputs_offloaded=inputs_offloaded,
        block_input=block_input,
    )
    _recompute_term(r, done, bool(checkpointed))
    return done


def _lora_key(train: Any) -> tuple[int, tuple[str, ...] | None] | None:
    lora = train.lora
    return None if lora is None else (lora.rank, lora.target_modules and tuple(lora.target_modules))


def saved_activations(
    r: _Rank, tokens: float, gathered_kv_tokens: float, first: bool = False
) -> tuple[BlockActivations, float, float]:
    """What one block saves on this rank, what lives outside the blocks, and what every block reads and
    none makes (the caption's embedding, the RoPE tables, the timestep's conditioning), read off the family's network
    (`module_costs.saved_per_rank`: a block of one tensor-parallel rank, trained or a LoRA's frozen base
    with its adapters, on the rank's tokens of a plain batch or a packed row), + all-gather CP's gathered
    keys and values and the loss's float32 error (4 bytes a latent value of a token). `first`: the first
    block, whose input needs no gradient under LoRA."""
    workload, cfg = r.workload, r.cfg
    saved = saved_per_rank(
        cfg,
        workload.grid,
        workload.samples,
        workload.packed,
        workload.text_tokens,
        workload.image_tokens,
        workload.token_levels,
        r.prec.compute,
        tokens,
        lora=_lora_key(r.train),
        first=first,
        tp=r.tp,
        sequence_parallel=r.sequence_parallel,
    )
    parts = {"saved for backward (read off the block)": saved.block}
    if gathered_kv_tokens:
        parts["gathered keys/values (all-gather CP)"] = gathered_kv_bytes(
            cfg, gathered_kv_tokens, r.prec.compute, r.tp
        )
    loss = 4 * cfg.patch_dim * tokens
    return BlockActivations(parts), saved.outside + loss, saved.shared


def _recompute_term(r: _Rank, acts: _Activations, checkpointed: bool) -> None:
    """What the backward holds besides the saved tensors: the block it recomputes (or brings back from
    host memory, prefetching the next)."""
    prec, train, terms, block_adapters = r.prec, r.train, r.terms, r.block_adapters
    one, op_level, offloaded = acts.one, acts.op_level, acts.offloaded
    inputs_offloaded, block_input = acts.inputs_offloaded, acts.block_input
    # LoRA under bf16 autocast: the block whose backward runs holds its adapters' bf16 casts as well
    casts = block_adapters * 2 if prec.autocast and train.lora is not None else 0
    also = f" + its adapters' bf16 casts {_gib(casts)}" if casts else ""
    if offloaded:
        # the block the backward is in, and the previous offloaded one, already on its way back (prefetch);
        # a block recomputed between the two holds no more than the one being brought back
        terms.append(
            Term(
                "recompute",
                2 * one.total + casts,
                f"the backward holds one offloaded block's tensors and prefetches the next: 2 x "
                f"{_gib(one.total)}{also}",
            )
        )
    elif checkpointed and inputs_offloaded:
        terms.append(
            Term(
                "recompute",
                one.total + 2 * block_input + casts,
                f"the backward re-runs one checkpointed block's forward ({_gib(one.total)}) from its input "
                f"brought back, and prefetches the previous block's: + 2 x {_gib(block_input)}{also}",
            )
        )
    elif checkpointed or op_level:
        terms.append(
            Term(
                "recompute",
                one.total + casts,
                f"the backward re-runs one checkpointed block's forward: {_gib(one.total)}{also}",
            )
        )


def _weight_copy_terms(r: _Rank, acts: _Activations) -> None:
    """The compute-dtype weight copies autocast keeps for the backward, and the fp8 base's dequantized
    weight."""
    (
        cfg,
        train,
        counts,
        prec,
        shards,
        blocks,
        block_params,
        outside_params,
        terms,
        block_adapters,
        adapters,
    ) = (
        r.cfg,
        r.train,
        r.counts,
        r.prec,
        r.shards,
        r.blocks,
        r.block_params,
        r.outside_params,
        r.terms,
        r.block_adapters,
        r.adapters,
    )
    recomputed, op_level, kept, offloaded = acts.recomputed, acts.op_level, acts.kept, acts.offloaded
    if prec.autocast and train.lora is None:
        # The Linear weights of this rank that autocast casts to bf16 and keeps for the backward: TP's
        # local shards of the layers outside the blocks and of each block that keeps its activations; a
        # checkpointed block's casts live only while it recomputes (one block at a time).
        linear_outside = counts.linear_weights - cfg.layers * counts.block_linear_weights
        block_share = block_params / counts.block
        outside_share = outside_params / counts.outside if counts.outside else 1.0
        held = kept + len(offloaded) + (1 if recomputed or op_level else 0)
        weights = linear_outside * outside_share + held * counts.block_linear_weights * block_share
        terms.append(
            Term(
                "weight copies",
                weights * 2,
                f"bf16 autocast casts the Linear weights this rank holds and keeps them for the backward: "
                f"{linear_outside * outside_share:,.0f} outside the blocks + {held} block(s) x "
                f"{counts.block_linear_weights * block_share:,.0f}"
                f"{' (checkpointed blocks: only the one recomputing)' if recomputed or op_level else ''} = "
                f"{weights:,.0f} x 2 B",
            )
        )
    elif prec.autocast:  # a bf16 (or float8) base is read as it is: only the fp32 adapters are cast
        # kept by the blocks that keep their activations; a recomputing (or offloaded) block's casts live
        # on the device only while its backward runs (counted in "recompute")
        cast = kept * block_adapters + (adapters * shards - blocks * block_adapters)
        terms.append(
            Term(
                "weight copies",
                cast * 2,
                f"bf16 autocast casts the fp32 LoRA adapters of the {kept} block(s) that keep their "
                f"activations (and any outside the blocks): {cast:,.0f} x 2 B",
            )
        )
    if train.lora is not None and train.lora.fp8_base:
        largest = counts.block_largest_linear
        terms.append(
            Term(
                "dequantized weight",
                largest * (4 + prec.compute),
                f"fp8 base: one linear at a time dequantized (float32, then the compute dtype): the largest "
                f"{largest:,.0f} weights x {4 + prec.compute} B",
            )
        )


def _communication_terms(r: _Rank, acts: _Activations) -> None:
    """FSDP's gathered blocks and collective buffers, sequence parallel's and pipeline parallel's."""
    (
        profile,
        layout,
        workload,
        cfg,
        train,
        counts,
        prec,
        blocks,
        tp,
        block_params,
        terms,
        notes,
        block_adapters,
    ) = (
        r.profile,
        r.layout,
        r.workload,
        r.cfg,
        r.train,
        r.counts,
        r.prec,
        r.blocks,
        r.tp,
        r.block_params,
        r.terms,
        r.notes,
        r.block_adapters,
    )
    tokens = acts.tokens
    comm = 0.0
    comm_parts = []
    if prec.fsdp:
        # LoRA: the frozen base is gathered as it is stored (bf16, or float8 with fp8_base)
        unsharded = (
            lora_block_bytes(profile, counts) if train.lora is not None else block_params * prec.compute
        )
        if layout.pp > 1:  # stages keep their weights gathered through the step (reshard_after_forward off)
            held = blocks * unsharded
            why = f"FSDP under pipeline parallel keeps the stage's {blocks} blocks unsharded through the step"
        else:  # the last block stays unsharded between forward and backward
            held = unsharded
            why = "FSDP keeps the last block unsharded from forward to backward"
        terms.append(Term("weight copies", held, f"{why}: {_gib(unsharded)} a block"))
        gather = 2 * unsharded
        # gradients exist for what trains: LoRA's adapters alone
        reduce = (block_adapters if train.lora is not None else block_params) * (prec.compute + 4)
        comm += gather + reduce
        comm_parts.append(
            f"FSDP all-gather of 2 blocks (current + prefetched) {_gib(gather)} and reduce-scatter of one "
            f"block's gradients (compute dtype + float32) {_gib(reduce)}"
        )
    if tp > 1 and r.sequence_parallel:
        size = workload.tokens / layout.cp * cfg.hidden * prec.compute
        comm += size
        comm_parts.append(f"sequence-parallel all-gather of a block input {_gib(size)}")
    if layout.pp > 1:
        size = 2 * tokens * cfg.hidden * prec.compute / (tp if r.sequence_parallel else 1)
        comm += size
        comm_parts.append(f"pipeline send + receive of one micro-batch's hidden states {_gib(size)}")
    if comm:
        terms.append(Term("communication buffers", comm, "; ".join(comm_parts)))
    if prec.fsdp and train.precision == "bf16":
        notes.append(
            "FSDP mixed precision: weights all-gathered and computed in bf16, gradients reduced in float32"
        )


def _backward_overlap(r: _Rank, acts: _Activations) -> None:
    """One micro-batch a step: the backward frees saved tensors as it fills gradients (the peak holds the
    larger); several: they add up."""
    layout, train, terms, notes = r.layout, r.train, r.terms, r.notes
    stored, in_flight = acts.stored, acts.in_flight
    blocks_saved = in_flight * stored
    if layout.pp == 1 and train.grad_accum == 1:
        # The peak of the step is in the backward: at its start every block's saved tensors and no
        # gradient, at its end every gradient and no block's saved tensors; the backward frees one block's
        # as it fills the block's gradients. So the two never add up: the peak holds the larger.
        grads = sum(t.bytes for t in terms if t.name == "gradients")
        overlap = min(blocks_saved, grads)
        if overlap:
            terms.append(
                Term(
                    "backward overlap",
                    -overlap,
                    f"the backward frees the blocks' saved tensors ({_gib(blocks_saved)}) as it fills the "
                    f"gradients ({_gib(grads)}): the peak holds the larger of the two, not both",
                )
            )
    else:
        notes.append(
            "gradients and activations are added: with several micro-batches a step (or pipeline stages) "
            "the gradients of the earlier ones are held while later ones keep their activations"
        )


def lora_block_bytes(profile: RunProfile, counts: ParameterCounts) -> float:
    """Bytes of one block's frozen LoRA base: the compute dtype, or with `fp8_base` its linear weights in
    one byte and a float32 scale per row (or per layer)."""
    lora, base = profile.train.lora, 2 if profile.train.precision == "bf16" else 4
    assert lora is not None
    if not lora.fp8_base:
        return counts.block * base
    return (
        (counts.block - counts.block_linear_weights) * base
        + counts.block_linear_weights
        + fp8_scale_bytes(profile, counts)
    )


def fp8_scale_bytes(profile: RunProfile, counts: ParameterCounts) -> float:
    """The float32 scales of one block's float8 base (buffers: FSDP2 neither shards nor casts them)."""
    lora = profile.train.lora
    if lora is None or not lora.fp8_base:
        return 0.0
    return 4 * (counts.block_linear_rows if lora.fp8_scaling == "row" else counts.block_linears)


def lora_base(
    profile: RunProfile,
    counts: ParameterCounts,
    blocks: int,
    shards: int,
    where: str,
    local_params: float,
    fsdp: bool = False,
) -> tuple[float, str, str]:
    """Device bytes of LoRA's frozen base on one rank, the arithmetic, and a note on what waits in host
    memory (block swap), or "". The base is in the compute dtype; with `fp8_base` the blocks' linear
    weights are one byte and a float32 scale per row (or per layer); with `blocks_to_swap` N blocks'
    frozen weights live on the host and at most two of them are on the device at once (one process: the
    block computing and the one coming; under FSDP2 (`fsdp`): the shards of the block being all-gathered
    and of the one prefetched, each rank's 1/shards of them, the gathered blocks counted as FSDP's)."""
    lora, base = profile.train.lora, 2 if profile.train.precision == "bf16" else 4
    assert lora is not None
    block = lora_block_bytes(profile, counts)
    what = f"frozen base (train.lora) in the compute dtype: {where} = {local_params:,.0f} params x {base} B"
    if lora.fp8_base:
        what = (
            f"frozen base (train.lora), its blocks' linear weights in float8 (fp8_base, one float32 scale per "
            f"{lora.fp8_scaling}): {blocks} blocks x {block / 2**20:,.1f} MiB + "
            f"{counts.outside:,.0f} outside the blocks x {base} B, / {shards} FSDP shard(s)"
        )
    swapped = min(lora.blocks_to_swap, blocks)
    on_device = blocks - swapped + min(swapped, 2)
    scales = fp8_scale_bytes(profile, counts)  # whole on every rank
    size = (on_device * (block - scales) + counts.outside * base) / shards + on_device * scales
    host = ""
    if swapped:
        what += (
            f"; block swap: {swapped} blocks' {'shards' if fsdp else 'weights'} in host memory, at most "
            f"{min(swapped, 2)} of them on the device at once ({on_device} blocks' worth)"
        )
        host = f"train.lora.blocks_to_swap: {_gib(swapped * block / shards)} of frozen weights in pinned host memory"
    return size, f"{what} = {_gib(size)}", host
