"""The Mistral-7B figure of every GradProbe variant in one table: projected (traced and scaled,
from `auditor gradprobe --variant V --target mistral-7b`) beside measured where it was run.

    python benchmarks/variants_at_7b.py --run-dir runs/variants-7b -o reports/variants-at-mistral-7b.md
    python benchmarks/variants_at_7b.py --from reports/variants-at-mistral-7b.json -o reports/variants-at-mistral-7b.md

The run folders are too large to commit; what the table needs of them (each variant's command,
audited peak and projections, sharded's per-rank worlds) is kept in the record beside the report
(REPORT.json), and `--from` makes the report again from it alone. Each variant is audited on
TinyStories-33M in a fresh process (`auditor gradprobe`, its report in the run folder) and
projected. Measured at 7B: only streaming fits this machine (24 GiB; the
in-memory variants hold the fp32 weights alone, 27 GiB); its figure is the committed 7B run of
reports/gradprobe-streaming.md, read from that report's record (reports/gradprobe-streaming.json).
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import benchmark_record

from auditor.record.schema import RunRecord

ROOT = Path(__file__).resolve().parents[1]
STREAMING_RECORD = Path("reports") / "gradprobe-streaming.json"  # read from where the script is run
# Streaming prunes from a weights folder; the measured 7B run's was bf16, so its projection's is too.
WEIGHTS = {"streaming": ["--weights-dtype", "bf16"]}
# Sharded is projected rank by rank (auditor project-ranks) at these world sizes.
WORLD_SIZES = ["2", "4", "8"]


def project(variant: str, folder: Path, reuse: bool = False) -> dict:
    run_dir = folder / variant
    command = ["auditor", "gradprobe", "--variant", variant, "--arch", "tinystories-33m",
               "--target", "mistral-7b", "--no-memray", "--run-dir", str(run_dir),
               "-o", str(folder / f"{variant}.md"), *WEIGHTS.get(variant, [])]
    row: dict = {"variant": variant, "command": command}
    if not (reuse and (run_dir / "run.json").is_file()) and not _ran(command, row):
        return row
    import auditor
    record = auditor.load(run_dir)
    if reuse:
        record.annotations["projections"] = _reprojected(record, run_dir)
    row["audited_peak"] = record.peak.rss
    for item in record.annotations.get("projections") or []:
        row[item.get("method", "scaled")] = _kept(item)
    return row


def _kept(item: dict) -> dict:
    """What the table reads of a projection, for the record: its peak, whether it was explained
    or projected at all, whether it was fitted, and the prune stage (streaming's measured figure
    is compared with it); the other stages and the fit's runs stay in the run folder."""
    kept = {k: item[k] for k in ("method", "target", "peak", "explained", "miss", "not_projected") if k in item}
    kept["stages"] = [s for s in item.get("stages") or [] if s.get("path") == "prune"]
    if item.get("fit"):
        kept["fit"] = {"runs": item["fit"].get("runs")}
    return kept


def _ran(command: list[str], row: dict) -> bool:
    """Run an auditor command in a fresh process; on failure, its last stderr line in row["failure"]."""
    done = subprocess.run([sys.executable, "-m", "auditor", *command[1:]], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        row["failure"] = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return done.returncode == 0


def project_ranks(folder: Path, reuse: bool = False) -> dict:
    """Sharded's per-rank projection to 7B: `auditor project-ranks` (reused when its folder holds one)."""
    run_dir = folder / "sharded-ranks"
    command = ["auditor", "project-ranks", "--arch", "tinystories-33m", "--target", "mistral-7b",
               "--world-size", *WORLD_SIZES, "--run-dir", str(run_dir), "-o", str(folder / "sharded-ranks.md")]
    row: dict = {"command": command}
    if not (reuse and (run_dir / "rank-projection.json").is_file()) and not _ran(command, row):
        return row
    import json
    row["worlds"] = json.loads((run_dir / "rank-projection.json").read_text())["worlds"]
    return row


def _per_rank(ranks: dict | None) -> str:
    """The traced cell of the sharded row: its worst rank's sharded part at each world size."""
    if not ranks:
        return "not projected (see below)"
    if "failure" in ranks:
        return f"per-rank projection FAILED: {ranks['failure'].replace('|', '/')}"
    return "per rank (worst rank, sharded part, live tensors): " + ", ".join(
        f"{_gib(w['worst']['sharded']['live_tensors'])} at {w['world_size']}" for w in ranks["worlds"]) + " ranks"


def _reprojected(record: RunRecord, run_dir: Path) -> list[dict]:
    """A reused run's projections made again from its records (the audit, its calibration and the
    traced run stay as they are), so that the table follows the analysis code; written back."""
    from auditor.analysis.projection.scaled import project
    from auditor.analysis.projection.traced import project_traced
    from auditor.jobs.gradprobe import load_traced
    from auditor.record.run_folder import write_derived
    made = []
    for old in record.annotations.get("projections") or []:
        if old.get("method", "scaled") == "traced":
            made.append(project_traced(record, load_traced(run_dir / f"traced-{old['target']}")))
        else:
            made.append(project(record, old["target"]))
    write_derived(run_dir, "projections", made)
    return made


def streaming_measured() -> dict | None:
    """The committed 7B streaming run's peak RSS and the prune command that measured it, from the
    streaming report's record."""
    if not STREAMING_RECORD.is_file():
        return None
    kept = benchmark_record.read(STREAMING_RECORD, ("parts",))["parts"].get("mistral-7b")
    if not kept:
        return None
    command = re.search(r"^\$ (python -m gradprobe\.streaming prune .*)$", kept["output"], re.M)
    return {"rss": kept["summary"]["peak_rss"], "command": command.group(1) if command else kept["command"]}


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:,.2f} GiB"


def _projected(item: dict | None) -> str:
    if not item:
        return "-"
    if item.get("not_projected"):
        return "not projected (see below)"
    if item.get("explained") is False:  # the report prints no number for it either
        miss = (item.get("miss") or {}).get("bytes")
        from auditor.facts.units import size
        return f"not explained by its drivers (miss {size(miss)}): see traced"
    peak = item.get("peak") or {}
    text = _gib(peak.get("rss"))
    estimated = peak.get("estimated")
    if estimated:
        text += f" ({_gib(estimated)} of it on estimated value-dependent sizes)"
    if item.get("method") == "scaled" and not (item.get("fit") or {}).get("runs"):
        text += " (uncalibrated)"
    return text


def render(rows: list[dict], measured: dict | None, command: str, ranks: dict | None = None) -> str:
    lines = ["| variant | audited peak RSS (TinyStories-33M) | projected 7B, traced | projected 7B, scaled "
             "| measured at 7B |",
             "|---|---:|---|---|---|"]
    for row in rows:
        if "failure" in row:
            lines.append(f"| {row['variant']} | FAILED: {row['failure'].replace('|', '/')} | - | - | - |")
            continue
        if row["variant"] == "streaming" and measured:
            at_7b = f"{measured['rss'] / 2**20:,.1f} MiB (the 7B run below)"
            # the 7B run wrote its weights folder in a process of its own: its prune is compared
            prune = next((s for s in (row.get("traced") or {}).get("stages") or [] if s["path"] == "prune"), None)
            if prune and prune.get("rss_peak"):
                at_7b += (f"; traced prune stage {_gib(prune['rss_peak'])}, "
                          f"{prune['rss_peak'] / measured['rss'] - 1:+.1%} off it")
        else:
            at_7b = "not run: the fp32 weights alone (27 GiB) exceed this machine's 24 GiB"
        traced = _per_rank(ranks) if row["variant"] == "sharded" else _projected(row.get("traced"))
        lines.append(f"| {row['variant']} | {row['audited_peak'] / 2**20:,.1f} MiB | "
                     f"{traced} | {_projected(row.get('scaled'))} | {at_7b} |")
    out = ["# Every GradProbe variant at Mistral-7B: projected, and measured where it ran", "",
           "Projected from a TinyStories-33M audit of each variant (sequence 128, batch 1, 2 "
           "batches, s = 0.1, r = 0.1, tau = 2.0, magnitude). Traced: the job run on fake tensors "
           "at the 7B shapes, plus the audited run's RSS beyond tensors; scaled: each component "
           "grown by its driver, fitted on traced calibration runs. Streaming prunes from a "
           "weights folder written in bf16, as its measured 7B run did.", "",
           "```", command, "```", "", *lines, ""]
    refused = {item["not_projected"] for r in rows for m in ("traced", "scaled")
               if (item := r.get(m)) and item.get("not_projected")}
    out += [f"Not projected: {why}" for why in sorted(refused)] + ([""] if refused else [])
    out += ["## Commands", ""] + [f"- {r['variant']}: `{shlex.join(r['command'])}`" for r in rows]
    if ranks:
        out += [f"- sharded, per rank: `{shlex.join(ranks['command'])}`"]
    if measured:
        out += ["", "Streaming at 7B (reports/gradprobe-streaming.md, section 2, bf16 weights on disk):",
                "", f"`{measured['command']}`"]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", help="where the runs go (required unless --from)")
    parser.add_argument("-o", "--output", required=True, help="the report; its record is written beside it")
    parser.add_argument("--from", dest="record", metavar="RECORD", help="make the report from a record "
                        "this script wrote, running nothing")
    parser.add_argument("--variant", action="append", help="only these variants")
    parser.add_argument("--reuse", action="store_true",
                        help="render from the runs already in --run-dir (run only the missing ones); "
                             "their projections are made again from their records")
    args = parser.parse_args()
    if args.record:
        kept = benchmark_record.read(args.record, ("command", "rows", "ranks"))
    elif not args.run_dir:
        parser.error("give --run-dir DIR to run, or --from RECORD")
    elif Path(args.run_dir).exists() and not args.reuse:
        print(f"--run-dir {args.run_dir!r} exists; give a new folder (or --reuse)", file=sys.stderr)
        return 2
    else:
        kept = measure(args)
        benchmark_record.write(benchmark_record.beside(args.output), kept)
    Path(args.output).write_text(render(kept["rows"], streaming_measured(), kept["command"], kept["ranks"]))
    return 0 if all("failure" not in r for r in [*kept["rows"], kept["ranks"] or {}]) else 1


def measure(args) -> dict:
    """Audit and project every variant (and sharded per rank); the record keeps what the table needs."""
    from gradprobe.variants import VARIANTS
    folder = Path(args.run_dir)
    folder.mkdir(parents=True, exist_ok=True)  # each variant's report beside its run folder
    rows = []
    for variant in args.variant or list(VARIANTS):
        print(f"{variant} ...", file=sys.stderr, flush=True)
        rows.append(project(variant, folder, args.reuse))
    ranks = None
    if any(r["variant"] == "sharded" for r in rows):
        print("sharded, per rank ...", file=sys.stderr, flush=True)
        ranks = project_ranks(folder, args.reuse)
    command = shlex.join(["python", "benchmarks/variants_at_7b.py", *(a for a in sys.argv[1:] if a != "--reuse")])
    return {"command": command, "rows": rows, "ranks": ranks}


if __name__ == "__main__":
    sys.exit(main())
