"""Analytic memory of one training rank for a profile's layout: parameters, gradients, optimizer states,
EMA, activations (with or without activation checkpointing), the compute-dtype weight copies autograd
keeps, and communication buffers. Every term carries the arithmetic that produced it, so a plan can be
read and checked by hand.

Activations follow what autograd saves in vidforge's blocks (counted op by op with
`torch.autograd.graph.saved_tensors_hooks`, see `vidforge.bench.measure`), per token of a rank:

  each sub-layer (self-attention, cross-attention, MLP; DiT has 3, sequential ST-DiT 4, parallel ST-DiT 3)
      4 x d     its LayerNorm input and output, the modulated input, the output the gate multiplies
      2         LayerNorm mean and rstd
  each self-attention scope (DiT 1, ST-DiT 2, parallel ST-DiT 3)
      9 x d     q and k projections before and after RMSNorm and RoPE, q/k/v as SDPA takes them, its
                output; 4 of the 9 in float32 under bf16 (RMSNorm and RoPE compute in float32)
      3 x heads RMSNorm rstd of q and k, the attention log-sum-exp (float32)
  cross-attention
      3 x d     the query projection before and after RMSNorm (2 in float32 under bf16), its output
      2 x heads RMSNorm rstd, log-sum-exp (float32)
      + 2 x d + heads with image tokens (model.image_dim): that attention's output and log-sum-exp, and
                the sum of the two outputs to_out reads; per image token its keys and values and the
                float32 input of norm_added_k and its rstd
  MLP          2 x mlp_hidden (GELU: fc1 output and the GELU output) or 4 x mlp_hidden (SwiGLU)
  several samples packed in a row
               + (chunks + sub-layers) x d: the modulation gathered per token (9 or 12 chunks of d,
               kept whole since the gates are views of it) and each sub-layer's 1 + scale; a row of
               one sample broadcasts its modulation (nothing per token)

in the compute dtype (4 bytes in fp32, 2 in bf16) unless noted. The wan family (`wan_block_norms`)
differs around the norms: Wan computes them, the modulation and the residual adds in float32 whatever
the compute dtype, and its cross-attention has no modulation and no gate. Outside the blocks: the final layer
(3 x d + 2), the patch embedding's input and the float32 loss (2 x patch_dim), the RoPE tables, and per
clip the caption's projections (5 x text_tokens x d per block for cross-attention's keys and values) and
an image-to-video clip's image embedding. A noise level per token (`Workload.token_levels`) makes the
modulation per token (as packing does) and runs the timestep MLP per token.

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

from vidforge.estimate.module_costs import block_bytes_per_rank
from vidforge.estimate.param_counts import (
    ParameterCounts,
    lora_adapted,
    lora_parameters,
    parameter_counts,
    tp_local_parameters,
)
from vidforge.estimate.workload import Workload
from vidforge.families import family
from vidforge.models.flops import TIMESTEP_FREQUENCIES
from vidforge.profile import RunProfile
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


def _scopes(cfg: Model) -> tuple[int, int, int, int]:
    """(sub-layers, self-attention scopes, full-attention scopes, modulation chunks) of one block: the
    scopes and chunks the family's block runs (`FamilySpec.block_scopes`); its modulated sub-layers (a
    DiT's self-attention, cross-attention and MLP; a sequential ST-DiT's spatial and temporal attention
    each; a parallel-mm block's joint attention and MLP)."""
    scopes, chunks = family(cfg.family).block_scopes(cfg)
    sublayers = 3
    if cfg.architecture == "stdit" and cfg.stdit_block != "parallel":
        sublayers = 2 if cfg.stdit_block == "parallel-mm" else 4
    return sublayers, len(scopes), scopes.count("full"), chunks


@dataclass(frozen=True)
class BlockActivations:
    """Bytes one block saves for its backward, on one rank, by part."""

    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def block_activations(
    cfg: Model,
    tokens: int,
    samples: int,
    text_tokens: int,
    compute: int,
    *,
    tp: int = 1,
    sequence_parallel: bool = True,
    per_token_modulation: bool = False,
    image_tokens: int = 0,
    gathered_kv_tokens: int = 0,
    key_groups: int = 1,
    frozen: bool = False,
    frozen_mlp: bool = False,
    lora_rank: int = 0,
    adapted: frozenset[str] = frozenset(),
) -> BlockActivations:
    """What one block saves for `tokens` tokens of this rank (after the context-parallel split) of
    `samples` clips. `gathered_kv_tokens`: tokens of other context-parallel ranks whose keys and values an
    all-gather CP keeps per full-attention layer. `image_tokens`: image-embedding tokens per clip that
    cross-attention also reads (`model.image_dim`). `key_groups`: attention groups of one clip over all
    scopes (frames + positions + 1); the multimodal block appends the caption's keys to each.
    `frozen`: a LoRA base, whose modulation, gates and norm weights need no gradient, so the products with
    them keep neither the norm's output, nor the gated output, nor the normalised q and k; `frozen_mlp`:
    the MLP has no adapters either, so its second projection keeps no input (counted on the CPU with
    saved-tensor hooks, as the rest). A frozen Wan block is counted by `wan_lora_block` (`lora_rank`,
    `adapted`)."""
    if frozen and family(cfg.family).table_modulation:  # a frozen block of Wan's layout
        parts = wan_lora_block(
            cfg,
            tokens,
            samples * text_tokens,
            compute,
            lora_rank,
            adapted,
            per_token_modulation,
            samples * image_tokens,
        )
        if gathered_kv_tokens:
            parts["gathered keys/values (all-gather CP)"] = 2 * gathered_kv_tokens * cfg.hidden * compute
        return BlockActivations(parts)
    d, m, h = cfg.hidden, cfg.mlp_hidden, cfg.heads
    sublayers, scopes, full_scopes, chunks = _scopes(cfg)
    f32 = 4
    low = 4 if compute == 2 else 0  # of the 9 per-scope tensors, how many are float32 under bf16
    norm_tp = tp if sequence_parallel else 1
    # LayerNorm input and output, the modulated input the projections read, the gated output; under
    # sequence parallel the first two and the gated output are this rank's tokens, the modulated input
    # is saved all-gathered (the whole sequence), and without it all four are whole.
    per_norm_local = (1 if frozen else 3) * d * compute + 2 * compute
    gathered_input = d * compute
    # Several samples in a row: the modulation gathered per token (chunks x d, kept whole because the gates
    # are views of it) and each sub-layer's (1 + scale). A row of one sample broadcasts its one modulation
    # row instead (`Conditioning.per_token`): nothing per token.
    modulation = (chunks + sublayers) * d * compute if per_token_modulation else 0
    # a frozen base: the RMSNorms' weight products keep no normalised q or k (2 of the float32 tensors of
    # a self-attention scope, 1 of cross-attention's)
    kept, low = (7, max(low - 2, 0)) if frozen else (9, low)
    attn_scope = ((kept - low) * compute + low * f32) * d + 3 * h * f32
    cross_low = (1 if frozen else 2) if compute == 2 else 0
    cross_kept = 2 if frozen else 3
    cross = ((cross_kept - cross_low) * compute + cross_low * f32) * d + 2 * h * f32
    mlp = ((4 if cfg.mlp_act == "swiglu" else 2) - (1 if frozen_mlp else 0)) * m * compute
    text = 5 * samples * text_tokens * d * compute / tp
    if image_tokens:
        # the image attention's output, the sum to_out reads, the log-sum-exp; per image token its keys
        # and values, and norm_added_k's float32 input and rstd
        cross += 2 * d * compute + h * f32
        text += samples * image_tokens * ((2 * compute + f32) * d + f32) / tp
    if family(cfg.family).table_modulation:
        local, modulation = wan_block_norms(cfg, compute, per_token_modulation, frozen)
        norms = local * tokens / norm_tp + sublayers * gathered_input * tokens
    else:
        norms = (sublayers * per_norm_local + modulation) * tokens / norm_tp
        norms += sublayers * gathered_input * tokens
    parts = {
        "norms, modulation, gates": norms,
        "self-attention": scopes * attn_scope * tokens / tp,
        "cross-attention": cross * tokens / tp + text,
        "mlp": mlp * tokens / tp,
    }
    if cfg.multimodal_block:
        del parts["cross-attention"]
        keys = samples * (text_tokens + cfg.context_latents)
        # The text norm's input and output, and per branch the text k/v outputs and normalised keys; then
        # each group's key row holds its caption's keys and values again.
        parts["caption keys (joint attention)"] = (3 + 3 * scopes + 2 * key_groups) * keys * d * compute
    if gathered_kv_tokens:
        parts["gathered keys/values (all-gather CP)"] = (
            full_scopes * 2 * gathered_kv_tokens * d * compute / tp
        )
    return BlockActivations(parts)


def chunks_of(cfg: Model) -> int:
    """Modulation vectors a block of the model's family projects (`FamilySpec.block_scopes`)."""
    return family(cfg.family).block_scopes(cfg)[1]


def wan_block_norms(
    cfg: Model, compute: int, per_token_modulation: bool, frozen: bool = False
) -> tuple[float, float]:
    """Bytes per token a Wan block saves around its norms, besides each sub-layer's input that the
    projections read (counted as the DiT's `gathered_input`), and of those the per-token modulation.

    Self-attention and feed-forward: the float32 norm input (x.float()) and output, mean and rstd, and
    the output the gate multiplies (attention's in the compute dtype, the feed-forward's float32).
    Cross-attention: the float32 input of its LayerNorm, mean and rstd (nothing without the norm).
    Several samples in a row, or a noise level per token: the six float32 modulation vectors per token and
    two (1 + scale).
    A frozen (LoRA) base: neither the norm outputs nor the gated outputs (no modulation gradient)."""
    d, f32 = cfg.hidden, 4
    norm = (1 if frozen else 2) * f32 * d + 2 * f32
    cross = f32 * d + 2 * f32 if cfg.cross_attn_norm else 0
    modulation = (chunks_of(cfg) + 2) * d * f32 if per_token_modulation else 0
    gated = 0 if frozen else compute * d + f32 * d
    return norm + cross + norm + gated + modulation, modulation


def wan_lora_block(
    cfg: Model,
    tokens: float,
    text: float,
    compute: int,
    rank: int,
    adapted: frozenset[str],
    per_token_modulation: bool,
    image: float = 0,
) -> dict[str, float]:
    """Bytes a Wan block with a frozen base and LoRA adapters on the layers `adapted` (`lora_adapted`:
    by default to_q, to_k, to_v and to_out.0 of both attentions) saves for its backward, by part, for
    `tokens` video tokens, `text` caption tokens and `image` image tokens in all (as counted on the CPU
    with saved-tensor hooks, op by op):

      each norm (self-attention's, the feed-forward's, cross-attention's with cross_attn_norm)
          its float32 input (4 x d) and mean and rstd; the (1 + scale) and gate products keep only the
          frozen modulation, never the norm's output
      each adapter
          its input, and lora_A's output (rank): the frozen projection keeps nothing, the adapter's
          lora_A needs its input for its weight's gradient. Adapters on one input share it (q, k and v;
          under autocast too: `vidforge.lora` keeps peft from copying it to float32), and
          to_out.0's is the attention output the kernel keeps
      each attention
          q and k RMS-normalised across the heads: their float32 inputs (4 x d) and rstd; the kernel's q,
          k, v, output and float32 log-sum-exp (heads)
      feed-forward
          GELU's input (mlp_hidden); with adapters, fc1's input and fc2's (the GELU output)
      image tokens (model.image_dim)
          the kernel's image keys and values, its output and log-sum-exp per video token; to_out.0's
          adapter then reads the sum of the two attentions' outputs, a tensor of its own

    in the compute dtype unless noted."""
    d, m, h, f32, c = cfg.hidden, cfg.mlp_hidden, cfg.heads, 4, compute

    def inputs(layers: list[str], width: int) -> float:
        """What the adapters on these layers, which read one input, keep of it."""
        n = sum(name in adapted for name in layers)
        return min(n, 1) * width * c + n * rank * c

    def out(layer: str) -> float:  # to_out.0 reads the attention output, which the kernel keeps
        return rank * c if layer in adapted else 0

    norm = f32 * d + 2 * f32
    qk_norm = f32 * d + f32
    modulation = (chunks_of(cfg) + 2) * d * f32 if per_token_modulation else 0
    norms = (3 if cfg.cross_attn_norm else 2) * norm + modulation
    self_attention = inputs(["attn1.to_q", "attn1.to_k", "attn1.to_v"], d) + out("attn1.to_out.0")
    self_attention += 2 * qk_norm + 4 * c * d + f32 * h
    # cross-attention: q from the video tokens, k and v from the caption's
    cross_tokens = inputs(["attn2.to_q"], d) + out("attn2.to_out.0") + qk_norm + 2 * c * d + f32 * h
    cross_text = inputs(["attn2.to_k", "attn2.to_v"], d) + qk_norm + 2 * c * d
    mlp = inputs(["ffn.net.0.proj"], d) + m * c + inputs(["ffn.net.2"], m)
    cross_image = 0.0
    if image:
        cross_tokens += c * d + f32 * h + (c * d if "attn2.to_out.0" in adapted else 0)
        added = {"attn2.add_k_proj", "attn2.add_v_proj"} & adapted
        cross_image = inputs(sorted(added), d) + (qk_norm if "attn2.add_k_proj" in added else 0) + 2 * c * d
    return {
        "norms, modulation, gates": norms * tokens,
        "self-attention": self_attention * tokens,
        "cross-attention": cross_tokens * tokens + cross_text * text + cross_image * image,
        "mlp": mlp * tokens,
    }


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
    _, scopes, _, _ = _scopes(cfg)
    kernels = scopes + 1 + (1 if image_tokens else 0)  # self-attention scopes, cross-attention, image's
    total += kernels * tokens * (cfg.hidden * compute + 4 * cfg.heads) / tp
    return total


def rope_bytes(cfg: Model, workload: Workload, tokens: int) -> float:
    """The float32 RoPE tables (cos and sin) of one micro-batch."""
    return 2 * (tokens if workload.packed else workload.tokens_per_sample) * (cfg.head_dim // 2) * 4


def outside_activations(
    cfg: Model, workload: Workload, tokens: int, compute: int, frozen: bool = False
) -> float:
    """Final layer, patch embedding input, float32 loss, RoPE tables, caption and timestep MLPs (the
    timestep's per token under `Workload.token_levels`: its sinusoids, the SiLU's input and the two
    projections' after it), an image-to-video clip's image embedding. A frozen Wan (LoRA) keeps only the
    final norm's float32 input, mean and rstd, the loss's float32 error and the RoPE tables: its frozen
    projections, embeddings and MLPs keep no input."""
    d, p = cfg.hidden, cfg.patch_dim
    per_token = workload.per_token_modulation
    rope = rope_bytes(cfg, workload, tokens)
    table = family(cfg.family).table_modulation  # Wan's block layout (FamilySpec.table_modulation)
    if frozen and table:
        return (4 * d + 8 + 4 * p) * tokens + rope
    if table:  # float32 norm input and output, the projection's input; per-token 1 + scale
        final = ((2 * 4 + compute + (4 if per_token else 0)) * d + 8) * tokens
    else:
        final = ((4 if per_token else 3) * d + 4) * compute * tokens  # per-token 1 + scale
    # the patch embedding reads the latents' and the condition's channels; the loss is on the latents'
    io = (p // cfg.in_channels * (cfg.in_channels + cfg.condition_channels) * compute + 4 * p) * tokens
    if workload.token_levels:
        # per token: the sinusoids, linear_1's output and linear_2's input, time_proj's input, and the
        # embedding itself (the float32 input of time_proj's SiLU)
        time, per_sample_time = ((TIMESTEP_FREQUENCIES + 3 * d) * compute + 4 * d) * tokens, 0
    else:
        time, per_sample_time = 0, TIMESTEP_FREQUENCIES + 2 * d
    captions = workload.samples * (workload.text_tokens * (cfg.text_dim + 2 * d) + per_sample_time) * compute
    # the image embedding: its float32 input (image_dim), the feed-forward's input, GELU's input and the
    # second layer's (image_dim each); three float32 tensors of the width around its last LayerNorm and
    # the output the blocks' key and value projections read; both LayerNorms' means and rstds
    image_dim, images = cfg.image_dim, workload.samples * workload.image_tokens
    images *= (4 + 3 * compute) * image_dim + (3 * 4 + compute) * d + 4 * 4
    return final + io + rope + captions + time + images


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
    one = measured_block(r, tokens, gathered) or block_activations(
        cfg,
        tokens,
        workload.samples,
        workload.text_tokens,
        prec.compute,
        tp=tp,
        sequence_parallel=par.sequence_parallel,
        per_token_modulation=workload.per_token_modulation,
        image_tokens=workload.image_tokens,
        gathered_kv_tokens=gathered,
        key_groups=workload.grid[0] + workload.grid[1] * workload.grid[2] + 1,
        frozen=train.lora is not None,
        frozen_mlp=train.lora is not None and not any(n.startswith(("mlp.", "ffn.")) for n in adapted),
        lora_rank=train.lora.rank if train.lora is not None else 0,
        adapted=adapted,
    )
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
    block_input = tokens * cfg.hidden * prec.compute / (tp if par.sequence_parallel else 1)
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
        first = measured_block(r, tokens, gathered, first=True)
        if first is not None:
            first_norm = one.total - first.total
            stored -= first_norm
    outside = outside_activations(cfg, workload, tokens, prec.compute, frozen=train.lora is not None)
    rope = rope_bytes(cfg, workload, tokens)
    if not kept:  # no block saves the RoPE tables on the device; the blocks' conditioning holds them
        outside -= rope
        terms.append(Term("rope tables", rope, "float32 cos and sin, held for the recompute or backward"))
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
    rope_here = ", RoPE" if kept else ""
    formula += f"; + {_gib(outside)} outside the blocks (final layer, patch input, loss{rope_here}, captions)"
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


def measured_block(
    r: _Rank, tokens: float, gathered_kv_tokens: float, first: bool = False
) -> BlockActivations | None:
    """What one block saves, read off the family's network (`module_costs.block_bytes_per_rank`): a block
    of one tensor-parallel rank (trained, or a LoRA's frozen base with its adapters) on a row of one clip,
    or of equal clips each with its own noise level (plain batches; a packed row of several clips
    gathers the modulation per token, which `block_activations` counts). `first`: the first block, whose
    input needs no gradient under LoRA. None where `block_activations` still counts it: tensor
    parallel's split, a packed row of several clips."""
    workload, cfg = r.workload, r.cfg
    packed_rows = workload.per_token_modulation and not workload.token_levels
    if r.tp > 1 or packed_rows:
        return None
    saved = block_bytes_per_rank(
        cfg,
        workload.grid,
        workload.samples,
        workload.text_tokens,
        workload.image_tokens,
        workload.token_levels,
        r.prec.compute,
        tokens,
        lora=_lora_key(r.train),
        first=first,
    )
    parts = {"saved for backward (read off the block)": saved}
    if gathered_kv_tokens:
        full_scopes = family(cfg.family).block_scopes(cfg)[0].count("full")
        parts["gathered keys/values (all-gather CP)"] = (
            full_scopes * 2 * gathered_kv_tokens * cfg.hidden * r.prec.compute
        )
    return BlockActivations(parts)


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
        par,
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
        r.par,
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
    if tp > 1 and par.sequence_parallel:
        size = workload.tokens / layout.cp * cfg.hidden * prec.compute
        comm += size
        comm_parts.append(f"sequence-parallel all-gather of a block input {_gib(size)}")
    if layout.pp > 1:
        size = 2 * tokens * cfg.hidden * prec.compute / (tp if par.sequence_parallel else 1)
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
