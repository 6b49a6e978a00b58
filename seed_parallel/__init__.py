"""Seed-parallel training: several seeds of one task in one process (``--run.seeds``); docs/design.md.

Importing the package imports nothing heavy: the sweep runner's process reads ``ROW_KEYS`` too."""

#: the keys (full form) in which the rows of one stack may differ besides their seed (``--run.rows``, a sweep's
#: ``vectorize_arms``): the optimizer's hyperparameters; its class stays the first row's
ROW_KEYS = "model.init_args.optimizer.init_args."
