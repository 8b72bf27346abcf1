"""Findings: rules over a run record, their noise band, the program's kind and remedies."""
