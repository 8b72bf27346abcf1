"""Do identical runs give the same findings? The spread of every figure a finding's rule compares
with a threshold, over identical audits of one workload, and the findings each run gets.

The workload is the main job's GradProbe audit on TinyStories-33M, without its projection runs
(they do not change the audited run's figures) and without memray; each run is its own process:

    auditor gradprobe --arch tinystories-33m --no-memray --no-trace --run-dir RUN_DIR/run-N -o RUN_DIR/run-N.md

The committed main record (reports/gradprobe-tinystories-33m-runs/audit, made by `make reports`
with the projection runs) is read beside them as one more run of the same audited workload. The
noise bands of auditor.analysis.noise_band are set from what this measures.

    .venv/bin/python benchmarks/findings_stability.py [--runs 5] [--run-dir runs/findings-stability]
    .venv/bin/python benchmarks/findings_stability.py --from reports/findings-stability.json
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchmark_record  # noqa: E402  (beside this script)
from auditor import units  # noqa: E402
from auditor.analysis import noise_band  # noqa: E402
from auditor.analysis.components import attribute, census_order, finished, live_tensor_high, peak_stage  # noqa: E402
from auditor.analysis.findings import findings  # noqa: E402
from auditor.record import load  # noqa: E402

COMMAND = ["auditor", "gradprobe", "--arch", "tinystories-33m", "--no-memray", "--no-trace"]
COMMITTED = "reports/gradprobe-tinystories-33m-runs/audit"
REPORT = ROOT / "reports" / "findings-stability.md"


def figures(folder: Path) -> dict:
    """What the rules compare with their thresholds in one run record, and its findings."""
    record = load(folder / "run.json")
    peak = record.peak.rss
    holder = peak_stage(record)
    beyond = attribute(holder).beyond_census if holder is not None else None
    high = live_tensor_high(record)
    slack = noise_band.allocator_slack(record)
    return {
        "peak_rss": peak,
        "beyond_census": beyond,
        "above_live_tensors": peak - high[0] if high is not None else None,
        "transients": {s.path: s.rss.peak - max(s.rss.start, s.rss.end) for s in finished(record)},
        "components": {s.path: {n: c.bytes for n, c in (s.components or {}).items()} for s in census_order(record)},
        "allocator_slack": slack[0] if slack is not None else None,
        "findings": sorted(f"{f.rule}: {f.severity}" for f in findings(record)),
    }


def measure(args) -> dict:
    run_dir = Path(args.run_dir)
    runs = []
    for n in range(1, args.runs + 1):
        folder = run_dir / f"run-{n}"
        if not (folder / "run.json").exists():
            command = [str(Path(sys.executable).parent / COMMAND[0]), *COMMAND[1:],
                       "--run-dir", str(folder), "-o", str(run_dir / f"run-{n}.md")]
            subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        runs.append({"run": f"run-{n}", **figures(folder)})
    runs.append({"run": "committed main record", **figures(ROOT / COMMITTED)})
    return {"command": " ".join(COMMAND + ["--run-dir", "RUN_DIR/run-N", "-o", "RUN_DIR/run-N.md"]),
            "benchmark": f".venv/bin/python benchmarks/findings_stability.py --runs {args.runs}",
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs)",
            "bands": {"rss_share_of_peak": noise_band.RSS_BAND},
            "runs": runs}


def spreads(record: dict) -> dict:
    """Each figure's spread (most - least over the runs), bytes and share of the median peak."""
    runs = record["runs"]
    median_peak = statistics.median(r["peak_rss"] for r in runs)

    def spread(values: list) -> dict:
        values = [v for v in values if v is not None]
        return {"least": min(values), "most": max(values), "bytes": max(values) - min(values),
                "share_of_peak": (max(values) - min(values)) / median_peak}

    stages = sorted({p for r in runs for p in r["transients"]}, key=list(runs[0]["transients"]).index)
    tensor = max((abs(a - b) for r in runs for s in r["components"] for n in r["components"][s]
                  for a, b in [(r["components"][s][n], runs[0]["components"].get(s, {}).get(n, -1))]), default=0)
    same = all(r["components"] == runs[0]["components"] for r in runs)
    return {"median_peak": median_peak, "peak_rss": spread([r["peak_rss"] for r in runs]),
            "beyond_census": spread([r["beyond_census"] for r in runs]),
            "above_live_tensors": spread([r["above_live_tensors"] for r in runs]),
            "transients": {s: spread([r["transients"].get(s) for r in runs]) for s in stages},
            "tensor_bytes_same": same, "tensor_bytes_most_apart": tensor}


def render(record: dict) -> str:
    found = spreads(record)
    runs = record["runs"]
    rss_most = max(found[k]["share_of_peak"] for k in ("peak_rss", "beyond_census", "above_live_tensors"))
    transient_most = max(t["share_of_peak"] for t in found["transients"].values())
    tallies = {tuple(r["findings"]) for r in runs}
    lines = [
        "# Findings stability: identical runs, the same findings",
        "",
        f"{len(runs)} identical audits of one workload: the findings were "
        + ("**the same in every run**" if len(tallies) == 1 else f"**{len(tallies)} different sets**")
        + f"; RSS figures moved by up to {rss_most:.1%} of the peak, a stage's transient by up to "
          f"{transient_most:.1%}, tensor bytes "
        + ("not at all" if found["tensor_bytes_same"] else f"by up to {units.size(found['tensor_bytes_most_apart'])}")
        + ". The noise bands the rules use (auditor/analysis/noise_band.py): "
          f"±{record['bands']['rss_share_of_peak']:.0%} of the peak for every figure from RSS readings "
          "(or what the run says glibc may keep, if larger), none for tensor bytes.",
        "",
        f"Each run: `{record['command']}` (the audited workload of `make audit`, without projection runs or "
        f"memray), plus the committed main record. Made by `{record['benchmark']}` on {record['machine']}.",
        "",
        "| run | peak RSS | RSS beyond the census at the peak stage's end | peak RSS above live tensors | "
        "glibc may keep (run's own) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in runs:
        peak = r["peak_rss"]
        lines.append(f"| {r['run']} | {units.mib(peak)} | {units.mib(r['beyond_census'])} "
                     f"({units.share(r['beyond_census'], peak)}) | {units.mib(r['above_live_tensors'])} "
                     f"({units.share(r['above_live_tensors'], peak)}) | {units.mib(r['allocator_slack'])} |")
    lines += ["", "Spread over the runs (most - least), as a share of the median peak "
              f"({units.mib(found['median_peak'])}):", "",
              "| figure | least | most | spread | share of the peak |", "|---|---:|---:|---:|---:|"]
    rows = [("peak RSS", found["peak_rss"]), ("RSS beyond the census", found["beyond_census"]),
            ("peak RSS above live tensors", found["above_live_tensors"])]
    rows += [(f"transient in `{s}`", t) for s, t in found["transients"].items()]
    for name, s in rows:
        lines.append(f"| {name} | {units.mib(s['least'])} | {units.mib(s['most'])} | {units.mib(s['bytes'])} | "
                     f"{s['share_of_peak']:.1%} |")
    lines += ["", "Findings per run (rule: severity):", ""]
    for r in runs:
        lines.append(f"- {r['run']}: " + ", ".join(r["findings"]))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--run-dir", default=str(ROOT / "runs" / "findings-stability"),
                        help="where the runs' records go (a run whose record is there already is read, not run again)")
    parser.add_argument("-o", "--output", default=str(REPORT), help="the report; its record is written beside it")
    parser.add_argument("--from", dest="record", metavar="RECORD",
                        help="make the report again from a record this script wrote, measuring nothing")
    args = parser.parse_args()
    if args.runs < 2:
        benchmark_record.refuse(f"--runs must be 2 or more to measure a spread, got {args.runs}")
    record = benchmark_record.read(args.record, ("runs", "bands")) if args.record else measure(args)
    if not args.record:
        benchmark_record.write(benchmark_record.beside(args.output), record)
    Path(args.output).write_text(render(record))
    print(f"report: {args.output}")


if __name__ == "__main__":
    main()
