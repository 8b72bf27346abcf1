"""The run report's allocation sites: memray's sites alive at its high-water mark, with the
flamegraph linked where a reader can open it (the training-step report has one section per
configuration). Formats auditor.report_models.run's `sites` only.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from auditor.facts import units
from auditor.record.schema import Memray
from auditor.renderers import markdown_text as md
from auditor.report_models.run import SiteLine, Sites

SITE_STACK_FRAMES = 3


def section(sites: Sites, report_folder: Path | None, run_folder: Path | None,
            head: str = "## Top allocation sites at the peak") -> str:
    """memray's sites alive at its high-water mark (the training-step report has one per
    configuration, titled its own way)."""
    memray, probe = sites.memray, sites.probe
    if memray is None:
        state = probe.state if probe is not None else None
        why = (probe.reason if probe is not None else None) or (
            "memray was off for this run (`auditor run --memray`; `auditor gradprobe` traces unless given --no-memray)"
            if state in (None, "off") else f"memray {state}")
        return f"{head}\n\nNo memray trace: {md.text(why)}."
    lead = (f"memray's high-water mark: {units.size(memray.peak_memory)} of native allocations "
            f"({_memray_stage(memray)}); its aggregated capture holds {memray.total_allocations or 0:,} records, "
            "each standing for any number of allocations (the table counts allocations). "
            "Sites alive at that instant, grouped by their innermost frame in user code:")
    if memray.auditor_bytes:
        lead += (f" ({units.size(memray.auditor_bytes)} allocated by the auditor itself and alive "
                 f"then are left out.)")
    if probe is not None and probe.reason:  # traced, but not the whole run
        lead = f"The trace {md.text(probe.reason)}.\n\n{lead}"
    rows = []
    for index, line in enumerate(sites.lines, 1):
        site = line.site
        where = f"{line.where}: {site.code}" if site.code else line.where  # the source line, read when summarized
        rows.append([str(index), md.code(where),
                     md.code(site.function) if site.function else "-",
                     units.size(site.bytes), f"{site.allocations:,}", _stack(line)])
    table = md.table(["#", "location and line", "function", "bytes", "allocations", "stack (innermost first)"],
                   rows, right={0, 3, 4}) if rows else "No allocation was alive at the high-water mark."
    return f"{head}\n\n{lead}\n\n{table}\n\n{_flamegraph_link(memray, report_folder, run_folder)}"


def _memray_stage(memray: Memray) -> str:
    """The stage memray's high-water mark belongs to, and how it was found (older records: the
    run's RSS-peak stage, said so)."""
    basis = memray.stage_basis
    at = f", about {units.seconds(memray.at_s)} into the audit" if memray.at_s is not None else ""
    if memray.stage:
        where = f"in stage {md.code(memray.stage)}"
    elif basis:
        where = "in no stage (unstaged time)"
    else:
        return "outside any stage"
    how = md.text(basis) if basis else "the run's RSS-peak stage (an older record: not located by time)"
    return f"{where}{at}; stage found by: {how}"


def _flamegraph_link(memray: Memray, report_folder: Path | None, run_folder: Path | None) -> str:
    name = memray.flamegraph
    if not name:
        return "No flamegraph was written for this run."
    if run_folder is None or report_folder is None:
        return f"Flamegraph: {md.code(name)} in the run folder."
    target = Path(run_folder) / name
    if _kept_out_of_git(target):  # a link would break for everyone reading the committed report
        folder = os.path.relpath(Path(run_folder).resolve(), Path(report_folder).resolve())
        return (f"Flamegraph: {md.code(name)} in the run folder {md.code(folder)}, where the command wrote it; "
                "git ignores it (megabytes), so it exists only where the command ran.")
    if not target.exists():
        return f"Flamegraph: {md.code(name)} was not found in the run folder {md.code(run_folder)}."
    return (f"Flamegraph of the allocations alive at the peak: "
            f"[{md.text(name)}]({md.relative_link(target, report_folder)}).")


def _kept_out_of_git(path: Path) -> bool:
    """True when `path` lies in a git work tree that ignores it (False without git)."""
    try:
        done = subprocess.run(["git", "check-ignore", "-q", path.name], cwd=path.parent,
                              capture_output=True, timeout=10) if path.parent.is_dir() else None
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done is not None and done.returncode == 0


def _stack(line: SiteLine) -> str:
    shown = []
    for frame in line.stack[:SITE_STACK_FRAMES]:
        function = frame.function if len(frame.function) <= 60 else frame.function[:57] + "..."
        shown.append(f"{function} ({frame.where})" if frame.where else function)
    if not shown:
        return "-"
    text = " ← ".join(shown) + (" ← …" if len(line.stack) > SITE_STACK_FRAMES else "")
    return ("native: " if line.native else "") + md.text(text)
