"""The training loop of `vidforge train`: schedule, EMA, checkpoints, metrics."""
