"""Seed-parallel training: several seeds of one task in one process (``--run.seeds``); docs/design.md."""
