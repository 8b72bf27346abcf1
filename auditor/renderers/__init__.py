"""Renderers: each formats one report's model into what people read, and computes nothing.

The model is made once, before a renderer sees it: by auditor/report_models/ (`run_report(record)`,
`train_step_report(records)`, `comparison_report(record, summary)`, `validation_report(result)`,
`device_side_by_side(...)`, `run_trace(record)`), or by analysis where its result is the report's
model (`merge_ranks(folder)`, `rank_projection(worlds, ...)`). The caller (auditor/cli/, benchmarks/,
tests/) makes it and hands it over; a renderer imports from analysis and report_models only types
and constants (tests/test_import_rules.py), never a run record or a dict to compute from.

The protocol, one name per role in every module (tests/test_renderer_protocol.py holds it):

    render(model, **where) -> str         a text report (markdown; the trace's JSON): its whole text
    render(model, path) -> Path | None    a PNG drawn into `path` (None: nothing to draw, nothing written)
    draw(model) -> Figure | None          that PNG's figure before it is saved, for tests that measure it
    write(model, out, **where) -> Path    a markdown report with PNGs beside it: all of them written, none
                                          left behind when one fails

`where`, keyword options, says only where things are or how the report was made: a chart's path
relative to the report, the report's and the run's folders for links, the command that made it.
Modules without `render` are sections of another renderer's report (answer_, components_,
projection_, sites_markdown) or its text helpers (markdown_text, plot_text). terminal.py is the one
renderer of another kind: it prints to a rich Console while a command runs, each function taking
(console, a piece of the model).
"""
