"""RunProfile: every section together, and the checks that span sections (layout vs. cluster vs. model)."""

from __future__ import annotations

from pydantic import model_validator
from pydantic_core import PydanticCustomError

from vidforge.profile.base import Section
from vidforge.profile.bench import Bench
from vidforge.profile.cluster import Cluster
from vidforge.profile.curation import Curation
from vidforge.profile.data import Data
from vidforge.profile.diffusion import Diffusion
from vidforge.profile.infer import Infer
from vidforge.profile.model import Model
from vidforge.profile.parallel import Layout, Parallel
from vidforge.profile.text_encoder import TextEncoder
from vidforge.profile.tokenizer import Tokenizer
from vidforge.profile.train import Train


class RunProfile(Section):
    """One run's whole configuration. Its defaults are the local default: one CPU process, tiny DiT."""

    name: str = "local_cpu"
    """A label for reports and run directories; by convention the YAML file's stem."""
    cluster: Cluster = Cluster()
    """Machines, accelerator and links."""
    parallel: Parallel = Parallel()
    """The 4D parallel layout."""
    model: Model = Model()
    """The diffusion transformer."""
    diffusion: Diffusion = Diffusion()
    """EDM noise, preconditioning and sampling."""
    curation: Curation = Curation()
    """`vidforge clip` and `vidforge caption`."""
    data: Data = Data()
    """Shards and the training loader."""
    tokenizer: Tokenizer = Tokenizer()
    """Video tokenizer (latents)."""
    text_encoder: TextEncoder = TextEncoder()
    """Caption embeddings for cross-attention."""
    train: Train = Train()
    """The training loop of `vidforge train`."""
    infer: Infer = Infer()
    """Sampling videos with `vidforge infer`."""
    bench: Bench = Bench()
    """`vidforge bench`: the synthetic workload, timing protocol and planning assumptions."""

    @model_validator(mode="after")
    def _check_layout(self) -> RunProfile:
        problems = layout_problems(self)
        if problems:
            # A custom error keeps the messages verbatim (no "Value error," prefix), each with its path.
            raise PydanticCustomError("layout", "; ".join(problems))
        return self

    @property
    def layout(self) -> Layout:
        return self.parallel.resolve(self.cluster.world_size)


def layout_problems(profile: RunProfile) -> list[str]:
    """Everything wrong with how the layout fits the cluster and the model, each as `path: message`."""
    par, model, cluster = profile.parallel, profile.model, profile.cluster
    problems = []
    if model.heads % par.tp:
        problems.append(f"parallel.tp: must divide model.heads={model.heads}, got {par.tp}")
    if par.cp > 1 and par.cp_impl == "ulysses" and model.heads % (par.tp * par.cp):
        problems.append(
            f"parallel.cp: ulysses context parallel needs tp x cp = {par.tp * par.cp} to divide "
            f"model.heads={model.heads}; use cp_impl=ring or all-gather, or another cp"
        )
    if par.cp > 1 and par.cp_impl == "st-hybrid" and model.architecture != "stdit":
        problems.append(
            "parallel.cp_impl: st-hybrid is for model.architecture=stdit; use all-gather, ring or ulysses"
        )
    if par.cp > 1 and par.cp_impl == "st-hybrid":
        problems += _st_hybrid_problems(profile)
    stages = par.pp * par.vpp
    if model.layers % stages:
        problems.append(
            f"parallel.pp: pp x vpp = {stages} must divide model.layers={model.layers}, got pp={par.pp}, vpp={par.vpp}"
        )
    try:
        par.resolve(cluster.world_size)
    except ValueError as err:
        problems.append(f"parallel: {err} (world size = {cluster.world_size_field})")
    return problems


def _st_hybrid_problems(profile: RunProfile) -> list[str]:
    """st-hybrid splits each clip by frames for spatial attention and by (h, w) positions for temporal
    attention: every data bucket's token grid needs T and H x W divisible by cp."""
    cp, tok, (pt, ph, pw) = profile.parallel.cp, profile.tokenizer, profile.model.patch
    problems = []
    for frames in profile.data.frame_buckets:
        t = ((frames - 1) // tok.temporal_compression + 1) // pt
        if t % cp:
            problems.append(
                f"data.frame_buckets: {frames} frames give {t} latent token frames, not divisible by "
                f"parallel.cp={cp} (st-hybrid splits clips by frames); change the bucket or cp"
            )
    for h, w in profile.data.buckets:
        positions = (h // tok.spatial_compression // ph) * (w // tok.spatial_compression // pw)
        if positions % cp:
            problems.append(
                f"data.buckets: ({h}, {w}) gives {positions} token positions a frame, not divisible by "
                f"parallel.cp={cp} (st-hybrid splits temporal attention by position); change the bucket or cp"
            )
    return problems
