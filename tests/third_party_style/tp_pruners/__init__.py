"""Pruners written in the style of well-known third-party repositories (not this project's
examples): a SparseGPT-like OBS pruner with a Catcher and hook closures."""
