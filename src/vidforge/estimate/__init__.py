"""Analytic estimates of a run before it runs, shared by `vidforge train --dry-run` and `vidforge bench`:
`workload` (the synthetic sample), `param_counts` (exact parameter counts by part, from a meta-device
model), `memory_model` (per-rank memory of a layout: the step's peak), `comm_model` (communication per
parallel dimension)."""
