"""Probes: each measures one kind of memory at stage boundaries.

A stage probe (rss, python_heap, cuda) answers three things: `read()` -> (values, level,
high water since the last reset), `reset()` of its high-water mark, and `entry(start, end,
peak)`, the stage's record field. The audit folds high-water marks into every open stage
before each reset, which gives each stage its true peak with nesting. Run-wide probes
(memray_trace, cuda history) start and stop with the run instead.
"""
