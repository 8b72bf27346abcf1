"""Renderers: turn a run record (and what analysis derives from it) into files people read."""
