"""Capture: the Audit of a run (stages, probes, census roots), writing the run record."""
