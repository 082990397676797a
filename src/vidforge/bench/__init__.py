"""`vidforge bench`: timers, MFU, the analytic memory and communication model of a parallel layout, layout
planning, benchmarks of training, inference, attention and curation, sweeps over profile fields, plots.

One module per concern: `workload` (the synthetic sample), `memory_model`, `comm_model`, `plan`,
`measure` (what autograd and the optimizer actually hold), `timing`, `train_bench`, `infer_bench`,
`attention_bench`, `curate_bench`, `sweep`, `plots`."""
