"""GradProbe baseline on TinyStories-33M (CPU): what it prunes, its peak RSS, and where the memory goes.

    .venv/bin/python benchmarks/gradprobe_baseline.py [--runs 3] [--threads 2] \
        -o reports/gradprobe-baseline-tinystories-33m.md     # fills its `output` block, writes its .json
    .venv/bin/python benchmarks/gradprobe_baseline.py --from reports/gradprobe-baseline-tinystories-33m.json \
        -o reports/gradprobe-baseline-tinystories-33m.md     # the same block again from the record

1. The `gradprobe` CLI, --runs times, each in a fresh process (seq 128, batch 1, 2 batches,
   s = 0.1, r = 0.1, tau = 2.0, magnitude): the table of what it prints.
2. The same prune once more in a fresh process, each pruner phase wrapped from outside: RSS
   at the phase's start and end, the peak inside it (VmHWM, reset per phase by writing "5" to
   /proc/self/clear_refs; Linux only) and the bytes of the pruner's structures at its end.
3. The floor, in a fresh process: the model plus one forward and backward, no pruning.

Wall times are noisy when other jobs share the machine's cores.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import benchmark_record

MiB = 1 << 20
SETTINGS = ["--arch", "tinystories-33m", "--seq-len", "128", "--batch-size", "1", "--batches", "2",
            "--sparsity", "0.1", "--reduction", "0.1", "--threshold", "2.0", "--strategy", "magnitude"]
PHASES = ["save_state", "record_original_gradients", "select_candidates", "reduce_candidates",
          "record_reduced_gradients", "decide", "apply_masks"]


# -- 1. the CLI in fresh processes --------------------------------------------------------------

def run_cli(threads: int) -> dict[str, str]:
    command = [sys.executable, "-m", "gradprobe", *SETTINGS, "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    fields = dict(re.findall(r"^(\w[\w ]*?)\s{2,}(.+)$", done.stdout, re.M))
    fields["output"] = done.stdout
    return fields


def cli_table(runs: list[dict[str, str]]) -> str:
    columns = [("final sparsity", lambda f: f["final sparsity"].split()[0]),
               ("candidates", lambda f: f["candidates"].split()[0]),
               ("pruned", lambda f: f["pruned"].split()[0]),
               ("peak RSS", lambda f: f["peak RSS"]),
               ("RSS before build", lambda f: f["RSS before build"]),
               ("RSS after build", lambda f: f["RSS after build"]),
               ("RSS after prune", lambda f: f["RSS after prune"]),
               ("prune wall", lambda f: f["wall time"].split(" s ")[0] + " s"),
               ("mask digest", lambda f: f["mask digest"][:16])]
    rows = [["run"] + [name for name, _ in columns]]
    rows += [[str(i + 1)] + [value(f) for _, value in columns] for i, f in enumerate(runs)]
    return _table(rows)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    align = lambda i, cell, w: cell.ljust(w) if i == 0 else cell.rjust(w)  # noqa: E731
    lines = ["| " + " | ".join(align(i, c, w) for i, (c, w) in enumerate(zip(row, widths, strict=False))) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# -- 2. per-phase memory, in a fresh process ----------------------------------------------------

def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.M).group(1))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # VmHWM := current RSS


def _rss() -> int:
    return _status_kib("VmRSS") * 1024


def _peak() -> int:
    return _status_kib("VmHWM") * 1024


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def structure_bytes(pruner) -> dict[str, int]:
    return {"model": _bytes(pruner.parameters.values()),
            "S": _bytes(pruner.saved_state.values()),
            "G0": _bytes(pruner.gradients_original.values()),
            "M_t": _bytes(pruner.candidates.values()),
            "G1": _bytes(pruner.gradients_reduced.values()),
            "M_f": _bytes(pruner.masks.values()),
            ".grad": _bytes(p.grad for p in pruner.parameters.values())}


def phase_timeline(threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM  # noqa: F401  (imported before "before build")

    from architectures import build_model
    from architectures.calibration import synthetic_batches
    from gradprobe import GradProbe
    torch.set_num_threads(threads)
    rows = [{"phase": "(process, torch + transformers imported)", "end": _rss()}]
    _reset_peak()
    model = build_model("tinystories-33m", seed=0)
    rows.append({"phase": "(model built)", "start": rows[0]["end"], "end": _rss(), "peak": _peak()})
    pruner = GradProbe(model, "magnitude")
    moments: list = []
    for phase in PHASES:
        _watch(pruner, phase, rows, moments)
    _watch_gradient_passes(moments)
    batches = synthetic_batches(model.config.vocab_size, 128, 1, 2, 0)
    result = pruner.prune(batches, loss_fn=_marking_loss(moments), sparsity=0.1)
    return {"rows": rows, "moments": moments, "pruned": result.pruned, "candidates": result.candidates}


def _watch(pruner, phase: str, rows: list, moments: list) -> None:
    method = getattr(pruner, phase)

    def watched(*args, **kwargs):
        start = _rss()
        _reset_peak()
        moments.append({"moment": f"{phase} starts", "rss": start, "peak": None})
        first = len(moments)
        returned = method(*args, **kwargs)
        inner_peaks = [m["peak"] for m in moments[first:]]  # the moments inside reset VmHWM
        rows.append({"phase": phase, "start": start, "end": _rss(), "peak": max([_peak(), *inner_peaks]),
                     "live": structure_bytes(pruner)})
        _mark(moments, f"{phase} ends")
        return returned
    setattr(pruner, phase, watched)


# Finer moments inside the gradient passes, seen from outside the pruner: the loss function is
# called when a forward pass ends, the record update when a backward pass ends.
def _mark(moments: list, what: str) -> None:
    moments.append({"moment": what, "rss": _rss(), "peak": _peak()})  # peak since the last moment
    _reset_peak()


def _marking_loss(moments: list):
    from gradprobe.loss import causal_lm_loss

    def loss(output, labels):
        batch = sum(m["moment"].endswith("backward done") for m in moments[_last_phase_start(moments):]) + 1
        _mark(moments, f"  batch {batch}: forward done")
        return causal_lm_loss(output, labels)
    return loss


def _last_phase_start(moments: list) -> int:
    return max(i for i, m in enumerate(moments) if m["moment"].endswith(" starts"))


def _watch_gradient_passes(moments: list) -> None:
    import gradprobe.gradients as gradients
    keep_running_max = gradients.keep_running_max

    def watched(record, name, tensor, dtype):
        if moments[-1]["moment"].endswith("forward done"):
            _mark(moments, moments[-1]["moment"].replace("forward", "backward"))
        keep_running_max(record, name, tensor, dtype)
    gradients.keep_running_max = watched


def moments_table(timeline: dict) -> str:
    rows = [["moment", "RSS", "peak since the row above"]]
    rows += [[m["moment"], f"{m['rss'] / MiB:,.0f}", f"{m['peak'] / MiB:,.0f}" if m["peak"] else ""]
             for m in timeline["moments"]]
    return _table(rows)


def timeline_table(timeline: dict) -> str:
    header = ["phase", "RSS start", "RSS end", "peak inside", "peak - start",
              "model", "S", "G0", "M_t", "G1", "M_f", ".grad", "tensors alive"]
    rows = [header]
    for row in timeline["rows"]:
        live = row.get("live", {})
        mib = lambda b: f"{b / MiB:,.0f}" if b is not None else ""  # noqa: E731
        rows.append([row["phase"], mib(row.get("start")), mib(row["end"]), mib(row.get("peak")),
                     mib(row["peak"] - row["start"]) if "peak" in row else "",
                     *[mib(live[k]) if live else "" for k in header[5:12]],
                     mib(sum(live.values())) if live else ""])
    return _table(rows)


# -- 3. the floor: one forward and backward, no pruning ------------------------------------------

def floor(threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM  # noqa: F401

    from architectures import build_model
    from architectures.calibration import synthetic_batches
    from gradprobe.dropout import dropout_disabled
    from gradprobe.loss import causal_lm_loss
    torch.set_num_threads(threads)
    before = _rss()
    model = build_model("tinystories-33m", seed=0)
    x = synthetic_batches(model.config.vocab_size, 128, 1, 1, 0)[0]
    built = _rss()
    _reset_peak()
    with dropout_disabled(model):
        loss = causal_lm_loss(model(x), x)
        forward_end, forward_peak = _rss(), _peak()
        _reset_peak()
        loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    return {"before build": before, "built": built, "forward end": forward_end,
            "forward peak": forward_peak, "backward peak": _peak(), "backward end": _rss(),
            ".grad bytes": grads}


def floor_table(numbers: dict) -> str:
    rows = [["measure", "MiB"]] + [[k, f"{v / MiB:,.1f}"] for k, v in numbers.items()]
    return _table(rows)


# -- driver -------------------------------------------------------------------------------------

def _in_fresh_process(part: str, threads: int) -> dict:
    command = [sys.executable, __file__, "--part", part, "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    benchmark_record.add_options(parser)
    parser.add_argument("--part", choices=["timeline", "floor"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:  # inside a fresh process started by the driver below
        print(json.dumps(phase_timeline(args.threads) if args.part == "timeline" else floor(args.threads)))
        return 0
    benchmark_record.publish(args, lambda: measure(args), output)
    return 0


def measure(args) -> dict:
    load = os.getloadavg()
    print(f"measuring: {args.runs} CLI runs, then the per-phase and floor processes", flush=True)
    return {"command": shlex.join([".venv/bin/python", "benchmarks/gradprobe_baseline.py", *sys.argv[1:]]),
            "threads": args.threads, "load_at_start": load[0], "cores": os.cpu_count(),
            "runs": [run_cli(args.threads) for _ in range(args.runs)],
            "timeline": _in_fresh_process("timeline", args.threads),
            "floor": _in_fresh_process("floor", args.threads)}


def output(record: dict) -> str:
    """What the benchmark prints, from its record alone."""
    runs, timeline = record["runs"], record["timeline"]
    digests = {f["mask digest"] for f in runs}
    sparsities = [float(f["final sparsity"].split("%")[0]) for f in runs]
    return "\n".join([
        f"gradprobe {' '.join(SETTINGS)} --threads {record['threads']}   "
        f"(load average at start {record['load_at_start']:.2f}, {record['cores']} cores)\n",
        "1. The CLI, each run in a fresh process. Output of run 1:\n",
        runs[0]["output"], cli_table(runs),
        f"\nmask digests identical across runs: {len(digests) == 1}",
        f"final sparsity {min(sparsities):.3f}-{max(sparsities):.3f}%; in 10.0-10.1% at one decimal: "
        f"{all(10.0 <= round(s, 1) <= 10.1 for s in sparsities)} (pruned <= candidates = exactly 10.000%)",
        "\n2. Per phase (MiB; RSS from /proc/self/status; 'peak inside' is VmHWM reset at the phase start;"
        "\n   structure columns are tensor bytes alive at the phase end):\n",
        timeline_table(timeline),
        f"\n   pruned {timeline['pruned']:,} of {timeline['candidates']:,} candidates",
        "\n   The same run, moment by moment (MiB):\n",
        moments_table(timeline),
        "\n3. The floor: model + one forward and backward (batch 1 x 128), no pruning:\n",
        floor_table(record["floor"]), ""])


if __name__ == "__main__":
    sys.exit(main())
