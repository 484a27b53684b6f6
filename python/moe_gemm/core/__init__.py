"""The floor every layer stands on: repository paths, argument checks, text tables, CLI plumbing.

Nothing here knows about GPUs, kernels or grouped GEMMs."""
