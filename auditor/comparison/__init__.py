"""Validating optimisation savings: does a variant really use less memory than the baseline,
and does it still give the same result?

Each side is a command (or a Python callable) run in fresh processes, alternating, `repeats`
times each. Per run: the process's exact peak RSS (`os.wait4` on that one child), its RSS once
its inputs are loaded (when it says so, see `protocol`), wall and CPU time, and its result,
compared element by element with the baseline's (safetensors files) or by digest.

    from auditor.comparison import Side, Tolerance, run_comparison
    comparison = run_comparison(Side("baseline", ["python", "prune.py"]),
                                [Side("lean", ["python", "prune.py", "--lean"], Tolerance(elements=0))],
                                repeats=3)
    comparison.summary["variants"][0]["verdict"]      # "ok" | "fail"
    comparison.save("runs/compare.json")              # re-render later: Comparison.load(...)

Modules, in the order the data flows: `side` (what to run), `launcher` and `measurement` (one
run), `protocol` (what a run may report), `result_files` (comparing results), `runner`
(alternation), `environment`, `record` (the JSON record), `verdict` (statistics, ratios,
agreement, verdict). Rendering is in `auditor/renderers/comparison_*.py`; GradProbe variants
as sides in `auditor/jobs/gradprobe_sides.py` (the comparison knows no algorithm).
"""
from auditor.comparison.measurement import RunFailed
from auditor.comparison.record import Comparison, ComparisonRecordError
from auditor.comparison.runner import run_comparison
from auditor.comparison.side import EXACT, Side, Tolerance

__all__ = ["EXACT", "Comparison", "ComparisonRecordError", "RunFailed", "Side", "Tolerance", "run_comparison"]
