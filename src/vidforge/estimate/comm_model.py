"""Communication volume per training step of one rank, for each parallel dimension, and its time over the
cluster's links (`cluster.intra_node_bandwidth_gbs` inside a node, `inter_node_bandwidth_gbs` between).

Ranks are numbered with tp innermost (mesh pp, dp_replicate, dp_shard, cp, tp), so a dimension's group
is spread over `degree x (product of the dimensions inside it)` consecutive ranks: inside one node when
that fits in `gpus_per_node`, across nodes otherwise (and then the slower link is what it gets).

Per micro-batch, with T tokens on a rank (after CP), d the width, e the compute dtype's bytes, P the
parameters of a pipeline stage after TP, n the group's degree (ring collectives: a rank sends
(n-1)/n of the data for an all-gather or reduce-scatter, twice that for an all-reduce):

- FSDP over dp_shard x cp: all-gather the weights in the forward and again in the backward
  (reshard after forward), reduce-scatter the float32 gradients: (n-1)/n x P x (2e + 4).
  Prefetched and overlapped with compute.
- dp_replicate (HSDP): all-reduce of the gradient shards: 2 (r-1)/r x P / n_fsdp x 4. Overlapped.
- TP with sequence parallel: an all-gather before and a reduce-scatter after each sub-layer, forward
  and backward (an all-reduce each without SP: the same volume): 4 x sub-layers x (t-1)/t x T x d x e
  per block. On the critical path.
- CP all-gather: keys and values gathered in the forward, their gradients reduce-scattered in the
  backward: 4 x (c-1) x T x d / t x e per full-attention layer (6 x with `cp_regather`). ring: the same
  K/V blocks passed c-1 times forward, K/V and their gradients backward (6 x ...), overlapped with the blocks' attention.
  ulysses: 4 all-to-alls forward (q, k, v, out) and 4 backward: 8 x (c-1)/c x T x d / t x e per
  attention. usp (2D, cp = u x r): Ulysses's all-to-alls over u consecutive cp ranks, 8 x (u-1)/u x T x d
  / t x e on their own (usually intra-node) link, plus the ring over r ranks, 6 x (r-1) x T x d / t x e
  (a ring rank's block is u x the tokens with 1/u of the heads: the same bytes), overlapped, on the cp
  group's link. st-hybrid: temporal attention's q, k, v all-to-all'ed to the positions layout and its
  output back, forward and backward: 8 x (c-1)/c x T x d / t x e per block, plus the parallel block's
  full attention as all-gather. st-spatial: spatial attention head-parallel, the same 8 x (c-1)/c
  x T x d / t x e per block (and again for the parallel block's full attention), T counting the pad
  columns when H x W does not divide by c (`Workload.tokens_per_rank`).
- PP: each micro-batch's hidden states sent forward and their gradient back at every stage boundary:
  2 x T x d x e (/t with sequence parallel). On the critical path (small).
Activation recompute repeats the forward's TP and CP collectives."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vidforge.estimate.param_counts import parameter_counts, tp_local_parameters
from vidforge.estimate.workload import Workload
from vidforge.profile import RunProfile
from vidforge.profile.layout_rules import sequence_parallel
from vidforge.profile.parallel import Layout


@dataclass(frozen=True)
class CommTerm:
    dim: str
    bytes: float
    """Bytes one rank sends per step in this dimension's collectives."""
    link: str
    bandwidth_gbs: float
    overlapped: bool
    """Hidden under compute (prefetch, ring) rather than on the critical path."""
    formula: str

    @property
    def seconds(self) -> float:
        return self.bytes / (self.bandwidth_gbs * 1e9)

    def as_dict(self) -> dict:
        return {**asdict(self), "seconds": self.seconds}


def group_link(profile: RunProfile, layout: Layout, dims: tuple[str, ...]) -> tuple[str, float]:
    """The slowest link a group over `dims` (adjacent mesh dimensions) uses."""
    order = list(Layout.MESH_DIMS)
    span = 1  # consecutive ranks the group is spread over: its own degrees x every dimension inside it
    for name in dims + tuple(order[order.index(dims[-1]) + 1 :]):
        span *= getattr(layout, name)
    return span_link(profile, span)


def span_link(profile: RunProfile, span: int) -> tuple[str, float]:
    """The slowest link of a group spread over `span` consecutive ranks."""
    cluster = profile.cluster
    if span <= cluster.devices_per_node:
        return "intra-node", cluster.intra_node_bandwidth_gbs
    return "inter-node", cluster.inter_node_bandwidth_gbs


def _sublayers_and_attention(profile: RunProfile) -> tuple[int, int]:
    cfg = profile.model
    if cfg.architecture == "dit":
        return 3, 1
    if cfg.stdit_block == "parallel-mm":  # summed joint-attention branches, MLP; no cross-attention
        return 2, 1
    return (3, 1) if cfg.stdit_block == "parallel" else (4, 0)


def communication(
    profile: RunProfile,
    layout: Layout,
    workload: Workload,
    microbatches: int,
    checkpointing: str = "none",
) -> list[CommTerm]:
    """Per-rank communication of one step of `microbatches` micro-batches, one term per active dimension."""
    cfg, par = profile.model, profile.parallel
    counts = parameter_counts(cfg)
    e = 2 if profile.train.precision == "bf16" else 4
    tp, cp, pp = layout.tp, layout.cp, layout.pp
    blocks = cfg.layers // pp
    stage_params = tp_local_parameters(counts, blocks, tp)
    tokens = workload.tokens_per_rank(cp, par.token_slicing)
    d = cfg.hidden
    fwd_repeats = 2 if checkpointing == "full" else 1  # recompute repeats the forward's collectives
    sublayers, full_attn = _sublayers_and_attention(profile)
    terms = []

    n = layout.dp_shard * cp
    if n > 1 or layout.dp_replicate > 1:
        if n > 1:
            size = microbatches * (n - 1) / n * stage_params * (2 * e + 4)
            link, bw = group_link(profile, layout, ("dp_shard", "cp"))
            formula = (
                f"{microbatches} micro-batch(es) x (n-1)/n = {n - 1}/{n} x {stage_params:,.0f} params x "
                f"(2 x {e} B all-gathers + 4 B reduce-scatter)"
            )
            terms.append(CommTerm("fsdp", size, link, bw, True, formula))
        r = layout.dp_replicate
        if r > 1:
            size = microbatches * 2 * (r - 1) / r * stage_params / n * 4
            link, bw = group_link(profile, layout, ("dp_replicate",))
            formula = (
                f"all-reduce 2 x {r - 1}/{r} x {stage_params / n:,.0f} gradient shard x 4 B per micro-batch"
            )
            terms.append(CommTerm("dp_replicate", size, link, bw, True, formula))
    if tp > 1:
        per_block = (2 + fwd_repeats) * 2 * sublayers * (tp - 1) / tp * tokens * d * e
        size = microbatches * blocks * per_block
        link, bw = group_link(profile, layout, ("tp",))
        formula = (
            f"{microbatches} x {blocks} blocks x {sublayers} sub-layers x 2 collectives x "
            f"{2 + fwd_repeats} passes x {tp - 1}/{tp} x {tokens:,.0f} tokens x {d} x {e} B"
        )
        terms.append(CommTerm("tp", size, link, bw, False, formula))
    if cp > 1 and par.cp_impl == "usp":
        local = tokens * d / tp * e
        terms.extend(_usp_terms(profile, layout, microbatches * blocks, local, fwd_repeats, full_attn))
    elif cp > 1:
        local = tokens * d / tp * e
        impl = par.cp_impl
        if impl == "all-gather":
            gathers = fwd_repeats + (1 if par.cp_regather else 0)  # re-gather: once more in the backward
            per_layer, overlapped = 2 * (cp - 1) * local * (gathers + 1) * full_attn, False
            what = (
                f"K and V all-gathered ({fwd_repeats} forward pass(es)"
                f"{' + the backward re-gather' if par.cp_regather else ''}) and their gradients reduce-scattered"
            )
        elif impl == "ring":
            per_layer, overlapped = (2 * fwd_repeats + 4) * (cp - 1) * local * full_attn, True
            what = "K/V blocks passed around the ring forward, K/V and their gradients backward"
        elif impl == "ulysses":
            attn = full_attn or 1
            per_layer, overlapped = (4 * fwd_repeats + 4) * (cp - 1) / cp * local * attn, False
            what = "all-to-all of q, k, v and the output, forward and backward"
        elif impl == "st-hybrid":
            # q, k, v (3 x local) to the positions layout and the output (1 x) back, every pass; the
            # parallel block's full attention by all-gathered K/V, as apply_st_hybrid runs it
            full = 2 * (cp - 1) * local * (fwd_repeats + 1) * full_attn
            per_layer, overlapped = (4 * fwd_repeats + 4) * (cp - 1) / cp * local + full, False
            what = (
                "temporal q, k, v and output all-to-all'ed between frames and positions, forward and backward"
            )
            what += ", full attention's K/V all-gathered" if full_attn else ""
        else:  # st-spatial: spatial (and full) attention head-parallel, the same 4 tensors each way
            per_layer, overlapped = (4 * fwd_repeats + 4) * (cp - 1) / cp * local * (1 + full_attn), False
            what = (
                "spatial q, k, v and output all-to-all'ed between positions and heads, forward and backward"
            )
            what += " (and the full attention's)" if full_attn else ""
        size = microbatches * blocks * per_layer
        link, bw = group_link(profile, layout, ("cp",))
        formula = (
            f"{microbatches} x {blocks} blocks: {what}; {tokens:,.0f} tokens/rank x {d}/{tp} x {e} B, cp={cp}"
        )
        terms.append(CommTerm(f"cp ({impl})", size, link, bw, overlapped, formula))
    if pp > 1:
        sp = tp if sequence_parallel(profile) else 1
        size = microbatches * 2 * tokens * d * e / sp
        link, bw = group_link(profile, layout, ("pp",))
        formula = f"{microbatches} micro-batches x (activations forward + gradients back) {tokens:,.0f} x {d} x {e} B"
        terms.append(CommTerm("pp", size, link, bw, False, formula))
    return terms


def _usp_terms(
    profile: RunProfile, layout: Layout, layers: int, local: float, fwd_repeats: int, full_attn: int
) -> list[CommTerm]:
    """2D context parallel's two collectives over `layers` attention layers (micro-batches x blocks):
    the Ulysses all-to-alls on the link of cp_ulysses x tp consecutive ranks, exposed, and the ring of
    cp / cp_ulysses ranks on the cp group's link, overlapped with the blocks' attention. `local` is the
    bytes of one rank's K (or V) activations."""
    u = profile.parallel.cp_ulysses
    ring = layout.cp // u
    attn = full_attn or 1
    shape = f"{local:,.0f} B of K per rank and layer, cp={layout.cp} = cp_ulysses {u} x ring {ring}"
    link, bw = span_link(profile, u * layout.tp)
    all_to_all = (4 * fwd_repeats + 4) * (u - 1) / u * local * attn * layers
    what = f"{layers} layers: all-to-all of q, k, v and the output, forward and backward; {shape}"
    terms = [CommTerm("cp (usp ulysses)", all_to_all, link, bw, False, what)]
    link, bw = group_link(profile, layout, ("cp",))
    passed = (2 * fwd_repeats + 4) * (ring - 1) * local * full_attn * layers
    what = f"{layers} layers: K/V blocks passed around the ring forward, K/V and their gradients backward; {shape}"
    terms.append(CommTerm("cp (usp ring)", passed, link, bw, True, what))
    return terms
