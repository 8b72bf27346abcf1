"""The summary table of reports/multi-rank-cpu.md, made from the committed rank records alone.

    .venv/bin/python benchmarks/multi_rank_cpu.py -o reports/multi-rank-cpu.md

The runs themselves are torchrun commands (written in the report); `auditor report` merges each
into its own report. This fills the report's `table` block: per run, the global peaks (RSS and
live tensors) with their rank and stage, and the imbalance across ranks, read from the merged
ranks (auditor.analysis.ranks.merged) of each run folder.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import benchmark_record

from auditor.analysis.ranks.merged import Spread, merge_ranks
from auditor.facts import units

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"2-ranks": "2 ranks, balanced",  # run folder -> how it was run (the report's commands)
        "4-ranks": "4 ranks, rank 2 holds 64 MiB more from `forward` on"}


def table(run_dir: Path) -> str:
    lines = ["| run | global peak RSS | rank, stage | peak live tensors | rank, stage | RSS max/min over ranks "
             "| live max/min |", "|---|---:|---|---:|---|---:|---:|"]
    for folder, label in RUNS.items():
        merged = merge_ranks(run_dir / folder)
        peak, live = merged.peak, merged.live_peak
        assert peak is not None and live is not None, f"{folder}: the committed ranks have RSS and live tensors"
        lines.append(f"| {label} | {units.size(peak.bytes)} | {peak.rank}, `{peak.stage}` | "
                     f"{units.size(live.bytes)} | {live.rank}, `{live.stage}` | "
                     f"{_spread(merged.imbalance.rss)} | {_spread(merged.imbalance.live)} |")
    return "\n".join(lines)


def _spread(spread: Spread | None) -> str:
    assert spread is not None and spread.ratio is not None
    return f"{spread.ratio:.2f}x (spread {units.size(spread.spread)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="reports/multi-rank-cpu-runs")
    parser.add_argument("-o", "--output", required=True, help="the report whose `table` block is filled")
    args = parser.parse_args()
    made = table(Path(args.run_dir))
    Path(args.output).write_text(benchmark_record.fill(args.output, {"table": made}))
    print(made)


if __name__ == "__main__":
    main()
