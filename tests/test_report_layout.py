"""The run report reads in one screen: the answer table (x the weights, at the target) in its
first 40 lines, at most about 220 lines outside `<details>`, no line over 500 characters, and
each variant that validated a remedy described once. Checked on the committed main report and
on a report rendered here from a small record."""
from __future__ import annotations

import json
import re
from pathlib import Path

from test_findings_remedies import cycle_record, typed

from auditor.facts import units
from auditor.renderers.markdown import render
from auditor.report_models.run import run_report

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "reports" / "gradprobe-tinystories-33m.md"
ANSWER_WITHIN = 40
MOST_OUTSIDE_DETAILS = 220
LONGEST_LINE = 500


def outside_details(text: str) -> list[str]:
    """The lines a reader sees before opening any `<details>` (nested ones included)."""
    shown, depth = [], 0
    for line in text.splitlines():
        opens, closes = line.count("<details>"), line.count("</details>")
        if depth == 0 and not opens:
            shown.append(line)
        depth += opens - closes
        assert depth >= 0, line
    assert depth == 0, "every <details> is closed"
    return shown


def answer_header(text: str) -> tuple[int, str]:
    """The answer table's header line and its line number (1-based)."""
    lines = text.splitlines()
    at = lines.index("## What was alive at the peak")
    number = next(i for i in range(at, len(lines)) if lines[i].startswith("| "))
    return number + 1, lines[number]


def check_layout(text: str, target: str, variants: list[dict]) -> None:
    number, header = answer_header(text)
    assert number <= ANSWER_WITHIN, number
    assert "| x the weights |" in header and f"at {target} (" in header, header
    assert len(outside_details(text)) <= MOST_OUTSIDE_DETAILS
    assert max(len(line) for line in text.splitlines()) <= LONGEST_LINE
    assert "Validated:" not in text  # no paragraph repeated under each finding
    for variant in variants:  # described once, named by its code span elsewhere
        assert text.count(variant["what"]) == 1, variant["variant"]
        assert text.count(f"- `{variant['variant']}`: ") == 1


def test_the_committed_main_report_reads_in_one_screen():
    text = MAIN.read_text(encoding="utf-8")
    record = json.loads((ROOT / "reports" / "gradprobe-tinystories-33m-runs" / "audit" / "run.json").read_text())
    variants = record["validated_remedies"]
    assert variants, "the main job cites the committed comparison's variants"
    check_layout(text, "mistral-7b", variants)
    title = text.splitlines()[0]  # the peak, its multiple of the weights, the target's peak
    assert re.fullmatch(r"# Memory report: .+: peak [0-9.,]+ GiB RSS, [0-9.]+x the weights; at mistral-7b "
                        r"[0-9.,]+ GiB \(scaled\), [0-9.,]+ GiB \(traced\)", title), title
    header = answer_header(text)[1]
    assert "at mistral-7b (scaled)" in header and "at mistral-7b (traced)" in header  # one table, both methods
    assert text.count("### Projection to mistral-7b") == 1
    assert "boundaries_s" not in text and "census_s" not in text  # no field names in prose


def test_a_small_report_rendered_here_reads_in_one_screen():
    record = cycle_record(projections=True)
    record["validated_remedies"] = [
        {"variant": "no-closure", "what": "the closure deleted before returning", "components": ["unreachable.cycles"],
         "rules": [], "peak_saving": 120 * 2**20, "claims_saving": True, "agreement": "identical", "runs": 3,
         "architecture": "tiny-llama", "source": "reports/compare-tiny-llama.json"},
        {"variant": "drop-kept", "what": "the helper's buffer freed on return", "components": ["helper.buffer"],
         "rules": ["retained-at-end", "reference-cycle"], "peak_saving": 2**20, "claims_saving": False}]
    text = render(run_report(typed(record)))
    check_layout(text, "llama-7b", record["validated_remedies"])
    fixes = text.split("## Fixes", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in fixes.splitlines() if line.startswith("| **")]
    assert rows and all(line.count("|") >= 6 for line in rows)
    assert "no saving beyond the noise" in fixes  # the variant that saved nothing says so, once


def test_sizes_from_one_gib_on_are_in_gib():
    assert units.size(2**30 - 2**20) == "1,023.0 MiB"
    assert units.size(2**30) == "1.00 GiB"
    assert units.size(60_790.9 * 2**20) == "59.37 GiB"
    assert units.signed_size(-3 * 2**30) == "-3.00 GiB"


def test_the_terminal_writes_gib_from_one_gib_on_as_the_report_does():
    assert units.mib_or_gib(60_790.9 * 2**20) == units.size(60_790.9 * 2**20) == "59.37 GiB"
    assert units.mib_or_gib(2**20) == "1.0 MiB" and units.signed_mib_or_gib(0) == "+0.0 MiB"
    assert units.signed_mib_or_gib(2 * 2**30) == "+2.00 GiB"
