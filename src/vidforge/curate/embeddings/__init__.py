"""Clip embeddings and what uses them: the image embedder, `vidforge clip --dedup`'s greedy pass,
semantic dedup across runs (`vidforge dedup`) and search (`vidforge search`)."""
