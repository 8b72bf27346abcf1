"""Projections to a target: scaled, traced, their standing, bands and validation."""
