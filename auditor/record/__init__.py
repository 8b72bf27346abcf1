"""The run record on disk: its schema, the run folder (event log, run.json, derived files), portable paths."""
