"""Multi-rank runs: ranks merged, and per-rank projection at target world sizes."""
