"""Parallelism applied from outside an unmodified model: the mesh, then (in this order) pipeline split,
tensor/sequence parallel, activation checkpointing, compile, FSDP."""
