"""Do identical runs give the same findings? The spread of every figure a finding's rule compares
with a threshold, over identical audits of a workload, and the findings each run gets.

Two workloads (WORKLOADS), each run --runs times, each run its own process: the main job's
GradProbe audit on TinyStories-33M without its projection runs (they do not change the audited
run's figures) and without memray, and the committed Hessian-pruner example's `auditor run`
without memray. The committed main record (made by `make reports`, memray on) is read beside the
GradProbe runs. The noise band of auditor.analysis.findings.noise_band is set from what this measures.

    .venv/bin/python benchmarks/findings_stability.py [--runs 4] [--run-dir runs/findings-stability]
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

from auditor.analysis.findings import noise_band  # noqa: E402
from auditor.analysis.findings.rules import findings  # noqa: E402
from auditor.analysis.run.attribution import attribute  # noqa: E402
from auditor.analysis.run.live_tensor_peak import live_tensor_high  # noqa: E402
from auditor.analysis.run.stages import census_order, finished, peak_stage  # noqa: E402
from auditor.facts import units  # noqa: E402
from auditor.record.run_folder import load  # noqa: E402

WORKLOADS = {  # name -> (what it is, its command: {run} is the run folder, the committed record read beside)
    "gradprobe": ("GradProbe on TinyStories-33M, the audited run of `make audit` without its projection runs "
                  "and memray",
                  ["auditor", "gradprobe", "--arch", "tinystories-33m", "--no-memray", "--no-trace",
                   "--run-dir", "{run}", "-o", "{run}.md"],
                  "reports/gradprobe-tinystories-33m-runs/audit"),
    "hessian": ("a Hessian pruner with a leaky feature cache on a random tiny Llama (the committed example's "
                "command without memray), examples/prune_tiny_llama.py",
                ["auditor", "run", "--run-dir", "{run}", "--census", "--live-tensors",
                 "--stage", "pruning.hessian:prune_with_hessians", "--stage", "pruning.hessian:HessianStat.add_batch",
                 "--stage", "pruning.leaky:collect_features", "examples/prune_tiny_llama.py", "--method", "hessian",
                 "--leak", "--eval", "--vocab", "32000", "--layers", "2", "--hidden", "256", "--intermediate", "688",
                 "--samples", "16", "--length", "128"],
                None),
}
COMMITTED_NOTE = "the committed main record (`make reports`: memray on, projection runs after it)"
REPORT = ROOT / "reports" / "findings-stability.md"


def figures(folder: Path) -> dict:
    """What the rules compare with their thresholds in one run record, and its findings."""
    record = load(folder / "run.json")
    peak = record.peak.rss
    holder = peak_stage(record)
    attribution = attribute(holder) if holder is not None else None
    high = live_tensor_high(record)
    slack = noise_band.allocator_slack(record)
    return {
        "peak_rss": peak,
        "beyond_census": attribution.beyond_census if attribution is not None else None,
        "above_live_tensors": peak - high[0] if high is not None else None,
        "transients": {s.path: s.rss.peak - max(s.rss.start, s.rss.end) for s in finished(record)},
        "allocator_slack": slack[0] if slack is not None else None,
        "findings": sorted(f"{f.rule}: {f.severity}" for f in findings(record)),
    }


def tensor_bytes_apart(folders: list[Path]) -> int | None:
    """The most two runs' census put apart one component at one stage end (None: no census)."""
    censuses = [{(s.path, n): c.bytes for s in census_order(load(f / "run.json"))
                 for n, c in (s.components or {}).items()}
                for f in folders]
    if not censuses[0]:
        return None
    keys = set().union(*censuses)
    return max(max(c.get(k, 0) for c in censuses) - min(c.get(k, 0) for c in censuses) for k in keys)


def measure(args) -> dict:
    workloads = []
    for name, (what, command, committed) in WORKLOADS.items():
        folders = []
        for n in range(1, args.runs + 1):
            folder = Path(args.run_dir) / name / f"run-{n}"
            if not (folder / "run.json").exists():
                line = [c.replace("{run}", str(folder)) for c in command]
                line[0] = str(Path(sys.executable).parent / line[0])
                subprocess.run(line, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            folders.append(folder)
        runs = [{"run": f"run-{n}", **figures(f)} for n, f in enumerate(folders, 1)]
        if committed:
            runs.append({"run": COMMITTED_NOTE, **figures(ROOT / committed)})
        workloads.append({"name": name, "what": what, "runs": runs,
                          "command": " ".join(c.replace("{run}", "RUN_DIR/run-N") for c in command),
                          "tensor_bytes_most_apart": tensor_bytes_apart(folders)})
    return {"benchmark": f".venv/bin/python benchmarks/findings_stability.py --runs {args.runs}",
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs)",
            "bands": {"rss_share_of_peak": noise_band.RSS_BAND}, "workloads": workloads}


def spreads(workload: dict) -> dict:
    """Each figure's spread (most - least over the runs), bytes and share of the median peak."""
    runs = workload["runs"]
    median_peak = statistics.median(r["peak_rss"] for r in runs)

    def spread(values: list) -> dict | None:
        values = [v for v in values if v is not None]
        if not values:
            return None
        return {"least": min(values), "most": max(values), "bytes": max(values) - min(values),
                "share_of_peak": (max(values) - min(values)) / median_peak}

    stages = [p for p in runs[0]["transients"] if all(p in r["transients"] for r in runs)]
    transients = {s: spread([r["transients"][s] for r in runs]) for s in stages}
    widest = max(transients, key=lambda s: transients[s]["bytes"])
    return {"median_peak": median_peak, "peak RSS": spread([r["peak_rss"] for r in runs]),
            "RSS beyond the census at the peak stage's end": spread([r["beyond_census"] for r in runs]),
            "peak RSS above the live-tensor peak": spread([r["above_live_tensors"] for r in runs]),
            f"transient in `{widest}` (the widest spread of {len(stages)} stages)": transients[widest]}


def render(record: dict) -> str:
    band = record["bands"]["rss_share_of_peak"]
    lines = ["# Findings stability: identical runs, the same findings", ""]
    summary, body = [], []
    for workload in record["workloads"]:
        runs, found = workload["runs"], spreads(workload)
        rows = {k: v for k, v in found.items() if k != "median_peak" and v is not None}
        most = max(v["share_of_peak"] for v in rows.values())
        same = len({tuple(r["findings"]) for r in runs}) == 1
        apart = workload["tensor_bytes_most_apart"]
        tensors = ("no census" if apart is None else "tensor bytes the same to the byte" if apart == 0
                   else f"tensor bytes up to {units.size(apart)} apart")
        summary.append(f"- {workload['name']}: {len(runs)} runs, findings "
                       + ("**the same in every run**" if same else "**not the same in every run**")
                       + f"; RSS figures up to {most:.1%} of the peak apart; {tensors}.")
        body += [f"## {workload['name']}", "", f"{workload['what'][0].upper()}{workload['what'][1:]}. Each run: "
                 f"`{workload['command']}`.", "",
                 "| run | peak RSS | RSS beyond the census at the peak stage's end | peak RSS above live tensors | "
                 "glibc may keep (the run's own) |", "|---|---:|---:|---:|---:|"]
        for r in runs:
            peak = r["peak_rss"]
            beyond = (f"{units.mib(r['beyond_census'])} ({units.share(r['beyond_census'], peak)})"
                      if r["beyond_census"] is not None else "no census where the peak was")
            body.append(f"| {r['run']} | {units.mib(peak)} | {beyond} | {units.mib(r['above_live_tensors'])} "
                        f"({units.share(r['above_live_tensors'], peak)}) | {units.mib(r['allocator_slack'])} |")
        body += ["", f"Spread over the runs (most - least), as a share of the median peak "
                 f"({units.mib(found['median_peak'])}):", "",
                 "| figure | least | most | spread | share of the peak |", "|---|---:|---:|---:|---:|"]
        for name, s in rows.items():
            body.append(f"| {name} | {units.mib(s['least'])} | {units.mib(s['most'])} | {units.mib(s['bytes'])} | "
                        f"{s['share_of_peak']:.1%} |")
        tallies = {tuple(r["findings"]) for r in runs}
        body += ["", "Findings (rule: severity), " + ("every run:" if len(tallies) == 1 else "run by run:"), ""]
        for r in runs if len(tallies) > 1 else runs[:1]:
            counted = {f: r["findings"].count(f) for f in dict.fromkeys(r["findings"])}
            body.append((f"- {r['run']}: " if len(tallies) > 1 else "- ")
                        + ", ".join(f"{f}" + (f" x{n}" if n > 1 else "") for f, n in counted.items()))
        body.append("")
    lines += summary + ["", "The noise band the rules use (auditor/analysis/findings/noise_band.py): "
                        f"±{band:.0%} of the peak "
                        "for every figure from RSS readings, or what the run's own record says glibc may keep "
                        "between runs where that is larger; none for tensor bytes. Inside it a finding is "
                        "\"borderline\". Made by "
                        f"`{record['benchmark']}` on {record['machine']}.", ""] + body
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--run-dir", default=str(ROOT / "runs" / "findings-stability"),
                        help="where the runs' records go (a run whose record is there already is read, not run again)")
    parser.add_argument("-o", "--output", default=str(REPORT), help="the report; its record is written beside it")
    parser.add_argument("--from", dest="record", metavar="RECORD",
                        help="make the report again from a record this script wrote, measuring nothing")
    args = parser.parse_args()
    if args.runs < 2:
        benchmark_record.refuse(f"--runs must be 2 or more to measure a spread, got {args.runs}")
    record = benchmark_record.read(args.record, ("workloads", "bands")) if args.record else measure(args)
    if not args.record:
        benchmark_record.write(benchmark_record.beside(args.output), record)
    Path(args.output).write_text(render(record))
    print(f"report: {args.output}")


if __name__ == "__main__":
    main()
