"""Token rows as host-side data, below the models: patchify, the layout of packed samples in one row
(`SequenceLayout`), attention masks (`KeyPadding`, `Segments`), and a context-parallel rank's share of a
row (`TokenShard`, `ContextShard`). Models, data and the parallel code all read these; nothing here
imports a model or a process group."""

from vidforge.token_grid import Grid, token_grid
from vidforge.tokens.layout import SequenceLayout, grid_positions, pack_latents, unpack_tokens
from vidforge.tokens.masks import KeyPadding, Segments
from vidforge.tokens.patchify import patchify, unpatchify
from vidforge.tokens.shard import ContextShard, TokenShard

__all__ = [
    "ContextShard",
    "Grid",
    "KeyPadding",
    "Segments",
    "SequenceLayout",
    "TokenShard",
    "grid_positions",
    "pack_latents",
    "patchify",
    "token_grid",
    "unpack_tokens",
    "unpatchify",
]
