"""The attention kernels every network's attention layer calls: the one dispatcher (dispatch.py: SDPA,
FlexAttention, flash-attn, the dense reference; which keys a query sees) and the sparse patterns it runs,
sliding-tile (sliding_tile.py) and video sparse attention (video_sparse.py). Below the networks
(`vidforge.models`, each family's) and the parallel attention that calls it; it knows only token rows."""
