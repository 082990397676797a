"""`vidforge bench`: timers, MFU, the analytic memory and communication model of a parallel layout, layout
planning, benchmarks of training, inference, attention and curation, sweeps over profile fields, plots.

One module per concern: `workload` (the synthetic sample), `param_counts` (exact parameter counts by
part, from a meta-device model), `memory_model` (per-rank memory of a layout), `comm_model`
(communication per parallel dimension), `plan` (layouts evaluated and ranked), `measure` (what autograd
and the optimizer actually hold), `timing`, `train_bench`, `infer_bench`, `attention_bench`,
`curate_bench`, `sweep`, `plots`."""
