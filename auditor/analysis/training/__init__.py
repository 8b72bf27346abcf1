"""Training steps: what a step holds and whether per-step peaks hold steady."""
