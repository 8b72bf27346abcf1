"""One run's stages, components, timeline and unstaged time, read from its record."""
