"""GradProbe's low-memory variants on TinyStories-33M (CPU): peak memory, time and decisions against the baseline.

    .venv/bin/python benchmarks/gradprobe_variants.py [--runs 2] [--threads 2] [--variants NAME[+DTYPE] ...] \
        -o reports/gradprobe-variants-tinystories-33m.md     # fills its `output` block, writes its .json
    .venv/bin/python benchmarks/gradprobe_variants.py --from reports/gradprobe-variants-tinystories-33m.json \
        -o reports/gradprobe-variants-tinystories-33m.md     # the same block again from the record

1. Every variant through the `gradprobe` CLI, each run in a fresh process (seq 128, batch 1,
   2 batches, s = 0.1, r = 0.1, tau = 2.0, magnitude), `--runs` rounds, the order reversed every
   other round. Per variant: peak RSS, peak over the loaded model (peak RSS - RSS after build),
   prune wall time, mask digest, and mask elements that differ from the baseline's (read from
   `--masks-out`). Ratios to the baseline are taken within a round, so both ran under the same load.
2. Once more per variant in a fresh process, each pruner phase wrapped from outside: the peak
   RSS inside it (VmHWM, reset at the phase start by writing "5" to /proc/self/clear_refs; Linux)
   and the tensor bytes of the pruner's structures when `prune` returns.

`lean+bf16` means `--variant lean --storage-dtype bf16`. Wall times are noisy when other jobs
share the cores; memory figures much less so.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import benchmark_record

MiB = 1 << 20
SETTINGS = ["--arch", "tinystories-33m", "--seq-len", "128", "--batch-size", "1", "--batches", "2",
            "--sparsity", "0.1", "--reduction", "0.1", "--threshold", "2.0", "--strategy", "magnitude"]
DEFAULT_VARIANTS = ["baseline", "sparse-state", "grad-in-backward", "checkpointed", "low-precision",
                    "lean", "lean+bf16"]
PHASES = ["select_candidates", "save_state", "record_original_gradients", "reduce_candidates",
          "record_reduced_gradients", "decide", "apply_masks"]


# -- 1. the CLI in fresh processes ----------------------------------------------------------------

def cli_command(spec: str, threads: int, masks: str, summary: str) -> list[str]:
    name, _, dtype = spec.partition("+")
    command = [sys.executable, "-m", "gradprobe", *SETTINGS, "--threads", str(threads),
               "--variant", name, "--masks-out", masks, "--summary-json", summary]
    return command + (["--storage-dtype", dtype] if dtype else [])


def run_round(specs: list[str], threads: int, folder: str) -> dict[str, dict]:
    """One fresh process per variant; mask differences against this round's baseline."""
    runs = {}
    for spec in specs:
        masks, summary = os.path.join(folder, f"{spec}.safetensors"), os.path.join(folder, f"{spec}.json")
        done = subprocess.run(cli_command(spec, threads, masks, summary), capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{spec}: exit status {done.returncode}\n{done.stderr}")
        with open(summary) as f:
            runs[spec] = {**json.load(f), "output": done.stdout, "load": os.getloadavg()[0]}
    baseline = _load_masks(os.path.join(folder, "baseline.safetensors"))
    for spec, run in runs.items():
        run["differing"] = _differing(baseline, _load_masks(os.path.join(folder, f"{spec}.safetensors")))
        os.remove(os.path.join(folder, f"{spec}.safetensors"))
    return runs


def _load_masks(path: str):
    from safetensors.torch import load_file
    return load_file(path)


def _differing(a: dict, b: dict) -> int:
    import torch
    if a.keys() != b.keys():
        raise ValueError("the two mask files name different parameters")
    return sum(int(torch.count_nonzero(a[name] != b[name])) for name in a)


def over_model(run: dict) -> int:
    return run["peak_rss"] - run["rss_after_build"]


def _spread(values: list, show) -> str:
    """'low - high' over the rounds, or one value where they print the same."""
    low, high = show(min(values)), show(max(values))
    return low if low == high else f"{low} - {high}"


def cli_table(rounds: list[dict[str, dict]], specs: list[str]) -> str:
    mib, ratio, count = (lambda b: f"{b / MiB:,.0f}"), (lambda x: f"{x:.2f}"), (lambda n: f"{n:,}")
    rows = [["variant", "peak RSS MiB", "peak over model MiB", "x baseline", "prune s", "x baseline",
             "pruned", "differing vs baseline", "mask digest"]]
    for spec in specs:
        runs = [r[spec] for r in rounds]
        memory_ratio = [over_model(r[spec]) / over_model(r["baseline"]) for r in rounds]
        time_ratio = [r[spec]["prune_seconds"] / r["baseline"]["prune_seconds"] for r in rounds]
        digests = {run["mask_digest"][:16] for run in runs}
        rows.append([spec, _spread([r["peak_rss"] for r in runs], mib), _spread([over_model(r) for r in runs], mib),
                     _spread(memory_ratio, ratio), _spread([r["prune_seconds"] for r in runs], lambda s: f"{s:.1f}"),
                     _spread(time_ratio, ratio), _spread([r["pruned"] for r in runs], count),
                     _spread([r["differing"] for r in runs], count),
                     digests.pop() if len(digests) == 1 else "DIFFER ACROSS RUNS"])
    return _table(rows)


def runs_table(rounds: list[dict[str, dict]]) -> str:
    rows = [["round", "order", "variant", "peak RSS", "after build", "after prune", "peak over model",
             "prune s", "load avg"]]
    for number, runs in enumerate(rounds, 1):
        for order, (spec, r) in enumerate(runs.items(), 1):
            rss = [f"{r[k] / MiB:,.1f}" for k in ("peak_rss", "rss_after_build", "rss_after_prune")]
            rows.append([str(number), str(order), spec, *rss, f"{over_model(r) / MiB:,.1f}",
                         f"{r['prune_seconds']:.1f}", f"{r['load']:.2f}"])
    return _table(rows)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    align = lambda cell, w: cell.rjust(w) if cell[:1].isdigit() else cell.ljust(w)  # noqa: E731
    lines = ["| " + " | ".join(align(c, w) for c, w in zip(row, widths, strict=False)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# -- 2. per-phase peaks and structures, in a fresh process ----------------------------------------

def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.M).group(1)) * 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # VmHWM := current RSS


def _bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is not None:
            total += t.nbytes if hasattr(t, "bits") else t.numel() * t.element_size()  # PackedMask or tensor
    return total


def structure_bytes(pruner) -> dict[str, int]:
    return {"S": _bytes(pruner.saved_state.values()), "G0": _bytes(pruner.gradients_original.values()),
            "M_t": _bytes(pruner.candidates.values()), "G1": _bytes(pruner.gradients_reduced.values()),
            "M_f": _bytes(pruner.masks.values()), ".grad": _bytes(p.grad for p in pruner.parameters.values()),
            "exact copies": _bytes(pruner.candidate_originals.values())}


def phase_peaks(spec: str, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM  # noqa: F401  (imported before the model is built)

    from architectures import build_model
    from architectures.calibration import synthetic_batches
    from gradprobe.cli import STORAGE_DTYPES
    from gradprobe.variants import make_pruner
    torch.set_num_threads(threads)
    name, _, dtype = spec.partition("+")
    model = build_model("tinystories-33m", seed=0)
    built = _status_bytes("VmRSS")
    pruner = make_pruner(name, model, "magnitude")
    peaks = {}
    for phase in PHASES:
        _watch(pruner, phase, peaks)
    batches = synthetic_batches(model.config.vocab_size, 128, 1, 2, 0)
    settings = {"storage_dtype": STORAGE_DTYPES[dtype]} if dtype else {}
    pruner.prune(batches, sparsity=0.1, num_batches=2, reduction_factor=0.1, gradient_threshold=2.0, **settings)
    return {"built": built, "peaks": peaks, "end": _status_bytes("VmRSS"), "structures": structure_bytes(pruner)}


def _watch(pruner, phase: str, peaks: dict) -> None:
    method = getattr(pruner, phase)

    def watched(*args, **kwargs):
        _reset_peak()
        returned = method(*args, **kwargs)
        peaks[phase] = _status_bytes("VmHWM")
        return returned
    setattr(pruner, phase, watched)


def phase_table(timelines: dict[str, dict]) -> str:
    short = {"select_candidates": "select", "save_state": "save S", "record_original_gradients": "G0 pass",
             "reduce_candidates": "reduce", "record_reduced_gradients": "G1 pass", "decide": "decide",
             "apply_masks": "apply"}
    rows = [["variant", "built", *short.values(), "peak phase"]]
    for spec, t in timelines.items():
        peak_phase = max(t["peaks"], key=t["peaks"].get)
        rows.append([spec, f"{t['built'] / MiB:,.0f}", *[f"{t['peaks'][p] / MiB:,.0f}" for p in short],
                     short[peak_phase]])
    return _table(rows)


def structures_table(timelines: dict[str, dict]) -> str:
    names = ["S", "M_t", "G0", "G1", "M_f", ".grad", "exact copies"]
    rows = [["variant", *names, "total"]]
    for spec, t in timelines.items():
        s = t["structures"]
        rows.append([spec, *[f"{s[n] / MiB:,.1f}" for n in names], f"{sum(s.values()) / MiB:,.1f}"])
    return _table(rows)


# -- driver -------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="rounds over every variant (>= 2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, metavar="NAME[+DTYPE]")
    benchmark_record.add_options(parser)
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a fresh process of part 2: the variant
    args = parser.parse_args()
    if args.part:
        print(json.dumps(phase_peaks(args.part, args.threads)))
        return 0
    benchmark_record.publish(args, lambda: measure(args), output)
    return 0


def measure(args) -> dict:
    specs = ["baseline"] + [s for s in args.variants if s != "baseline"]
    load = os.getloadavg()[0]
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        for number in range(args.runs):
            print(f"round {number + 1} of {args.runs}", flush=True)
            order = specs if number % 2 == 0 else specs[::-1]
            rounds.append(_cleaned(run_round(order, args.threads, folder), folder))
    timelines = {}
    for spec in specs:
        command = [sys.executable, __file__, "--part", spec, "--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        timelines[spec] = json.loads(done.stdout.splitlines()[-1])
    return {"command": shlex.join([".venv/bin/python", "benchmarks/gradprobe_variants.py", *sys.argv[1:]]),
            "threads": args.threads, "specs": specs, "load_at_start": load, "load_at_end": os.getloadavg()[0],
            "cores": os.cpu_count(), "rounds": rounds, "timelines": timelines}


def _cleaned(runs: dict, folder: str) -> dict:
    """The round's runs without this machine's temporary folder in them."""
    return json.loads(json.dumps(runs).replace(folder, "$TMP"))


def output(record: dict) -> str:
    """What the benchmark prints, from its record alone."""
    rounds, specs, timelines = record["rounds"], record["specs"], record["timelines"]
    return "\n".join([
        f"gradprobe {' '.join(SETTINGS)} --threads {record['threads']} --variant ...   "
        f"(load average at start {record['load_at_start']:.2f}, {record['cores']} cores)\n",
        f"1. The CLI, each run in a fresh process, {len(rounds)} rounds (order reversed every other round).\n"
        "   Output of the lean variant's first run:\n",
        rounds[0].get("lean", rounds[0]["baseline"])["output"],
        runs_table(rounds),
        "\n   Per variant (MiB; a range is min - max over the rounds; 'x baseline' is the ratio to the\n"
        "   baseline of the same round; 'peak over model' = peak RSS - RSS after build):\n",
        cli_table(rounds, specs),
        "\n2. Per phase, one more fresh process per variant: peak RSS inside each phase (MiB, VmHWM\n"
        "   reset at the phase start), in the order the phases run for lean:\n",
        phase_table(timelines),
        "\n   Tensor bytes of the pruner's structures when prune returns (MiB; 'exact copies' are the\n"
        "   fp32 originals of candidates that a half-precision full S cannot restore):\n",
        structures_table(timelines),
        f"\n(load average at end {record['load_at_end']:.2f})", ""])


if __name__ == "__main__":
    sys.exit(main())
