"""Small pruning algorithms written in the style of per-layer research code (SparseGPT-,
Wanda-, OBS-style), for auditing code this project did not shape for its auditor.

They know nothing about the auditor: `prune_tiny_llama.py` runs them, and `auditor run
--stage ...` stages them from outside. Each state they keep has a size one can compute by hand,
so tests can hold the auditor's report to exact bytes.
"""
