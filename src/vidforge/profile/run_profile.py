"""RunProfile: every section together. The checks that span sections (layout vs. cluster vs. model) are
`checks.profile_problems`, run where a profile loads."""

from __future__ import annotations

from pydantic import Field

from vidforge.profile.bench import Bench
from vidforge.profile.cluster import Cluster
from vidforge.profile.curation import Curation
from vidforge.profile.data import Data
from vidforge.profile.diffusion import Diffusion
from vidforge.profile.infer import Infer
from vidforge.profile.model import ModelSection, default_model
from vidforge.profile.parallel import Layout, Parallel
from vidforge.profile.stages import Stage
from vidforge.profile.text_encoder import TextEncoder
from vidforge.profile.tokenizer import Tokenizer
from vidforge.profile.train import Train
from vidforge.section import Section


class RunProfile(Section):
    """One run's whole configuration. Its defaults are the local default: one CPU process, tiny DiT."""

    name: str = "local_cpu"
    """A label for reports and run directories; by convention the YAML file's stem."""
    cluster: Cluster = Cluster()
    """Machines, accelerator and links."""
    parallel: Parallel = Parallel()
    """The 4D parallel layout."""
    model: ModelSection = Field(default_factory=default_model)
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
    stages: list[Stage] = []
    """A curriculum: stages `vidforge train` runs in order, each overriding a few data and train fields and
    starting from the previous stage's EMA weights. Empty: one run with the profile as it is."""

    @property
    def layout(self) -> Layout:
        return self.parallel.resolve(self.cluster.world_size)
