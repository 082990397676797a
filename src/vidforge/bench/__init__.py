"""`vidforge bench`: timers, MFU, layout planning over the analytic models of `vidforge.estimate`,
benchmarks of training, inference, attention and curation, sweeps over profile fields, plots.

One module per concern: `plan` (layouts evaluated and ranked), `fit` (what fits one GPU), `measure` (what autograd
and the optimizer actually hold), `timing`, `train_bench`, `infer_bench`, `attention_bench`,
`curate_bench`, `sweep`, `plots`."""
