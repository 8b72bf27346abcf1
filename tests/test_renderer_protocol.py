"""Every renderer keeps the one protocol auditor/renderers/__init__.py states: its entry point is
`render`, taking its report model first (a type of report_models or analysis, never a run record
or a dict); a PNG renderer's is `render(model, path)` beside `draw(model)`; none of the names the
renderers had before the protocol is left."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import pytest

import auditor.renderers

# modules without `render`: sections of another renderer's report, and its text helpers
SECTIONS = {"answer_markdown", "components_markdown", "projection_markdown", "sites_markdown", "markdown_text",
            "plot_text"}
CONSOLE = {"terminal"}  # prints to a Console as a command runs: (console, model) per function
IMAGES = {"timeline_plot", "components_plot", "train_step_chart", "comparison_chart"}
OLD_NAMES = {"write_report", "format_report", "render_report", "write_png", "render_projection", "report_tables",
             "format_sites", "format_environment"}
MODEL_FLOORS = ("auditor.report_models.", "auditor.analysis.")


def renderer_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(auditor.renderers.__path__))


def test_the_protocol_lists_every_renderer():
    assert {*SECTIONS, *CONSOLE} <= set(renderer_modules())
    assert set(renderer_modules()) - SECTIONS - CONSOLE, "no renderer left to check"


@pytest.mark.parametrize("name", [m for m in renderer_modules() if m not in SECTIONS | CONSOLE])
def test_each_renderer_takes_its_model(name):
    module = importlib.import_module(f"auditor.renderers.{name}")
    render = getattr(module, "render", None)
    assert callable(render), f"{name} has no render()"
    parameters = list(inspect.signature(render).parameters.values())
    model = typing.get_type_hints(render)[parameters[0].name]
    assert inspect.isclass(model) and model.__module__.startswith(MODEL_FLOORS), (name, model)
    if name in IMAGES:
        assert [p.name for p in parameters] == [parameters[0].name, "path"], name
        assert callable(getattr(module, "draw", None)), f"{name} has no draw()"
    else:  # everything after the model says where things are: keyword options
        assert typing.get_type_hints(render)["return"] is str, name
        assert all(p.default is not inspect.Parameter.empty or p.kind is inspect.Parameter.KEYWORD_ONLY
                   for p in parameters[1:]), (name, parameters)


@pytest.mark.parametrize("name", renderer_modules())
def test_no_old_entry_point_is_left(name):
    module = importlib.import_module(f"auditor.renderers.{name}")
    assert OLD_NAMES.isdisjoint(vars(module)), (name, OLD_NAMES & set(vars(module)))
