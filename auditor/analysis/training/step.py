"""What a training step holds, read from a train-step run record (auditor.jobs.train_step).

    study = training.study(record)
    study["components"]      # parameters, gradients, optimizer state... measured and expected
    study["explanations"]    # why one step's breakdown and the peak over many steps differ

Pure functions over the record: nothing here imports torch or reaches a live process.
Sizes in bytes. Live tensors come from the dispatch-mode meter (exact), RSS from the
per-stage high-water mark, CUDA from the caching allocator.
"""
from __future__ import annotations

from auditor.analysis.training.stability import classify
from auditor.facts.units import share, signed_size, size
from auditor.record.schema import LiveTensors, RunRecord, Stage

ACTIVATION_TOLERANCE = 0.02  # saved-tensor accounting vs live-tensor growth over the forward
MEASURES = {"live_tensors": "live tensors", "rss": "RSS", "cuda_allocated": "CUDA allocated"}


# -- stages --------------------------------------------------------------------------------

def stage(record: RunRecord, path: str) -> Stage | None:
    return next((s for s in record.stages if s.path == path and s.status == "ok"), None)


def step_numbers(record: RunRecord) -> list[int]:
    return [int(s.name.split()[1]) for s in record.stages
            if s.parent is None and s.name.startswith("step ") and s.status == "ok"]


def micro_stages(record: RunRecord, step: int, kind: str) -> list[Stage]:
    """`forward` or `backward` stages of a step, micro-batch order."""
    return [s for s in record.stages if s.parent == f"step {step}" and s.status == "ok"
            and s.name.split()[0] == kind]


def peaks(entry: Stage | None) -> dict:
    """A stage's peaks: live tensors, RSS and (on GPU) CUDA allocated and reserved."""
    if entry is None:
        return {"live_tensors": None, "rss": None, "cuda_allocated": None, "cuda_reserved": None}
    cuda = entry.cuda
    return {"live_tensors": entry.live_tensors.peak if entry.live_tensors else None,
            "rss": entry.rss.peak,
            "cuda_allocated": cuda.peak_allocated if cuda else None,
            "cuda_reserved": cuda.reserved_end if cuda else None}


def _meter(entry: Stage) -> LiveTensors:
    """The stage's live-tensor meter: a train-step run has it on."""
    assert entry.live_tensors is not None, f"stage {entry.path!r} has no live-tensor meter"
    return entry.live_tensors


def _growth(entry: Stage) -> int:
    """Live-tensor bytes the stage left behind: its end reading above its start."""
    meter = _meter(entry)
    assert meter.start is not None and meter.end is not None, "a finished stage's live-tensor readings"
    return meter.end - meter.start


def _live_peak(entry: Stage) -> int:
    peak = _meter(entry).peak
    assert peak is not None, "a finished stage's live-tensor peak"
    return peak


def transient(entry: Stage) -> int:
    """Live-tensor bytes that exist only inside the stage: its peak above its start and end."""
    meter = _meter(entry)
    assert meter.start is not None and meter.end is not None, "a finished stage's live-tensor readings"
    return _live_peak(entry) - max(meter.start, meter.end)


# -- the study -----------------------------------------------------------------------------

def study(record: RunRecord) -> dict:
    steps = step_numbers(record)
    result = {"settings": record.annotations["workload"]["settings"], "steps": steps,
              "complete": record.exit is not None and record.exit.status == "ok"}
    if not steps:
        return result
    per_step = series(record)
    result.update(components=components(record), activation_check=activation_check(record),
                  calculator=calculator_check(record), series=per_step,
                  forward_only=forward_only(record, per_step))
    live = per_step["live_tensors"]
    if live:
        top = max(range(len(live)), key=live.__getitem__)
        name = peak_stage_name(record, steps[top])
        result["peak"] = {"step": steps[top], "stage_name": name,
                          "stage": f"step {steps[top]}/{name}", "live_tensors": live[top]}
    result["one_against_many"] = one_against_many(per_step, result["components"])
    result["explanations"] = explanations(record, result)
    result["stability"] = {key: classify(values, label=MEASURES[key])
                           for key, values in result["series"].items() if values}
    return result


def components(record: RunRecord) -> list[dict]:
    """Rows: name, measured bytes, expected bytes (from the config) or None, how it was measured."""
    expected = record.annotations["workload"]["expected"]
    measured = record.annotations.get("measured") or {}
    saved = measured.get("saved_tensors") or {}
    rows = [
        _row("parameters", measured.get("parameters"), expected["parameters"],
             f"{expected['parameter_count']:,} parameters x {expected['element_bytes']} B"),
        _row("gradients", measured.get("gradients"), expected["gradients"],
             "one .grad per parameter, same dtype"),
        _row("optimizer state", measured.get("optimizer_state"), expected["optimizer_state"],
             expected["optimizer_rule"]),
        _row("saved activations", saved.get("activations"), None,
             "saved-tensor hooks, unique storages, model state excluded"),
    ]
    if measured.get("buffers"):
        rows.append(_row("model buffers", measured["buffers"], None,
                         "registered buffers (e.g. causal-mask tables), unique storages"))
    if saved.get("autocast weight copies"):
        rows.append(_row("autocast weight copies", saved["autocast weight copies"], None,
                         "low-precision casts of the weights, saved for backward"))
    holder = max(_step_stages(record), key=_live_peak, default=None)
    if holder is not None:
        rows.append(_row("temporaries", transient(holder), None,
                         f"at the peak, in {holder.path}: the stage's peak above its start and end"))
    return rows


def _row(name, measured, expected, how) -> dict:
    exact = None if expected is None or measured is None else measured == expected
    return {"name": name, "measured": measured, "expected": expected, "exact": exact, "how": how}


def _step_stages(record: RunRecord) -> list[Stage]:
    return [s for s in record.stages if s.status == "ok" and s.parent
            and s.parent.startswith("step ") and s.live_tensors is not None]


def activation_check(record: RunRecord) -> dict | None:
    """Saved-tensor accounting against the live tensors the first forward left behind."""
    saved = (record.annotations.get("measured") or {}).get("saved_tensors")
    forwards = micro_stages(record, 1, "forward")
    forward = forwards[0] if forwards else None
    if not saved or forward is None:
        return None
    accounted = saved["activations"] + saved["autocast weight copies"]
    grown = _growth(forward)
    difference = grown - accounted
    relative = difference / accounted if accounted else None
    return {"saved": accounted, "live_growth": grown, "difference": difference,
            "relative": relative,
            "within_tolerance": relative is not None and abs(relative) <= ACTIVATION_TOLERANCE,
            "tolerance": ACTIVATION_TOLERANCE}


def calculator_check(record: RunRecord) -> dict | None:
    """The config-only activation calculator against the saved-tensor bytes."""
    calc = record.annotations["workload"].get("activation_calculator")
    saved = (record.annotations.get("measured") or {}).get("saved_tensors")
    if not calc or not saved:
        return None
    if "unavailable" in calc:
        return {"unavailable": calc["unavailable"]}
    per_layer = saved["per_layer"]
    return {"residual_stream": calc["residual_stream"], "saved": calc["saved"],
            "computed_per_layer": calc["saved"]["per_layer"]["total"],
            "measured_per_layer": max(per_layer) if per_layer else None,
            "measured_layers": per_layer,
            "computed_total": calc["saved"]["total"], "measured_total": saved["activations"],
            "computed_weight_copies": calc["saved"]["weight_copies_total"],
            "measured_weight_copies": saved["autocast weight copies"]}


def series(record: RunRecord) -> dict:
    """Each step's peak: live tensors, RSS, and on GPU CUDA allocated."""
    out: dict[str, list] = {"live_tensors": [], "rss": [], "cuda_allocated": []}
    for entry in _step_stages_by_number(record):
        for key, value in peaks(entry).items():
            if key in out and value is not None:
                out[key].append(value)
    return out


def one_against_many(per_step: dict, components_: list[dict]) -> list[dict]:
    """Side by side: the components summed, step 1's peak, and the peak over all steps."""
    summed = sum(row["measured"] or 0 for row in components_ if row["name"] != "temporaries")
    rows = []
    for key, values in per_step.items():
        if values:
            rows.append({"measure": MEASURES[key], "summed": summed if key == "live_tensors" else None,
                         "first_step": values[0], "all_steps": max(values), "steps": len(values)})
    return rows


def forward_only(record: RunRecord, per_step: dict) -> dict:
    """Inference forward against the full step, for each measure present."""
    forward = peaks(stage(record, "forward only"))
    step = {key: max(values) if values else None for key, values in per_step.items()}
    return {key: {"forward_only": forward[key], "full_step": step.get(key)}
            for key in ("live_tensors", "rss", "cuda_allocated")
            if forward[key] is not None and step.get(key) is not None}


# -- why a one-step breakdown and the peak over many steps differ -------------------------

def explanations(record: RunRecord, result: dict) -> list[str]:
    rows = {row["name"]: row["measured"] for row in result["components"]}
    lines = [_sum_versus_peak(result["peak"], rows)]
    lines += [line for line in (_optimizer_warm_up(record, rows), _accumulation(record, rows),
                                _process_overhead(result["series"]), _cuda_caching(record)) if line]
    return lines


def _sum_versus_peak(peak: dict, rows: dict) -> str:
    total = sum(v for k, v in rows.items() if k != "temporaries" and v)
    text = (f"The components add up to {size(total)} (everything but temporaries, as if all lived at "
            f"once), while the measured peak of live tensors is {size(peak['live_tensors'])}, in step "
            f"{peak['step']}'s `{peak['stage_name']}` stage ({signed_size(peak['live_tensors'] - total)}).")
    if peak["live_tensors"] < total:
        return text + (" Activations are freed during backward as gradients appear, so the two "
                       "never coexist in full.")
    return text + (f" Temporaries of that stage ({size(rows.get('temporaries'))}) come on top of "
                   f"what persists, and a sum of persistent components misses them.")


def peak_stage_name(record: RunRecord, step: int) -> str:
    """The stage of step `step` where live tensors peaked (forward, backward, optimizer...)."""
    children = [s for s in record.stages if s.parent == f"step {step}" and s.live_tensors is not None]
    return max(children, key=_live_peak).name


def _optimizer_warm_up(record: RunRecord, rows: dict) -> str | None:
    state = rows.get("optimizer state")
    first, second = stage(record, "step 1/optimizer"), stage(record, "step 2")
    if not state or first is None:
        return None
    grown = _growth(first)
    line = (f"Optimizer state appears at step 1: +{size(grown)} of live tensors in step 1's "
            f"`optimizer` stage (the state measured is {size(state)}).")
    if second is not None:
        one = max(_live_peak(s) for s in micro_stages(record, 1, "backward"))
        two = max(_live_peak(s) for s in micro_stages(record, 2, "backward"))
        line += (f" From step 2 on it is held through forward and backward too: step 2's backward "
                 f"peaks at {size(two)} against step 1's {size(one)} ({signed_size(two - one)}).")
    return line


def _accumulation(record: RunRecord, rows: dict) -> str | None:
    backward = micro_stages(record, 1, "backward")
    if len(backward) < 2:
        return None
    first, later = _live_peak(backward[0]), _live_peak(backward[1])
    return (f"Accumulation over {len(backward)} micro-batches: gradients ({size(rows.get('gradients'))}) "
            f"stay alive from the first micro-batch's backward to the optimizer, so micro-batch 2's "
            f"backward peaks at {size(later)} against micro-batch 1's {size(first)} "
            f"({signed_size(later - first)}).")


def _process_overhead(per_step: dict) -> str | None:
    live, rss = per_step["live_tensors"], per_step["rss"]
    if not live or not rss:
        return None
    return (f"Process memory: the peak RSS over {len(rss)} steps is {size(max(rss))} (step 1: "
            f"{size(rss[0])}), against at most {size(max(live))} of live tensors; the "
            f"{size(max(rss) - max(live))} between them is the interpreter, libraries and what "
            f"the allocator keeps after frees, which a tensor-level breakdown does not count.")


def _step_stages_by_number(record: RunRecord) -> list[Stage | None]:
    """Each step's stage, as `stage` finds it, in one pass over the stages."""
    finished: dict[str, Stage] = {}
    for entry in record.stages:
        if entry.status == "ok":
            finished.setdefault(entry.path, entry)
    return [finished.get(f"step {number}") for number in step_numbers(record)]


def _cuda_caching(record: RunRecord) -> str | None:
    cuda = [peaks(entry) for entry in _step_stages_by_number(record)]
    if not cuda or cuda[0]["cuda_allocated"] is None:
        return None
    allocated = max(c["cuda_allocated"] for c in cuda)
    reserved = max(c["cuda_reserved"] or 0 for c in cuda)
    return (f"CUDA caching allocator: {size(reserved)} reserved against a peak of {size(allocated)} "
            f"allocated ({share(reserved - allocated, reserved)} of the reservation is cached or "
            f"fragmented); nvidia-smi shows the reservation plus the CUDA context.")


# -- sweeps --------------------------------------------------------------------------------

def sweep_rows(records: list[RunRecord]) -> list[dict]:
    """One row per configuration: forward-only and full-step peaks, saved activations."""
    rows = []
    for record in records:
        settings = record.annotations["workload"]["settings"]
        result = study(record)
        saved = ((record.annotations.get("measured") or {}).get("saved_tensors") or {})
        row = {"architecture": settings["architecture"], "sequence_length": settings["sequence_length"],
               "precision": settings["precision"], "complete": result["complete"],
               "saved_activations": saved.get("activations"),
               "weight_copies": saved.get("autocast weight copies"),
               "state": _state_bytes(record), "float32_activations": _float32_bytes(record),
               "peak_stage": result.get("peak", {}).get("stage")}
        for key, pair in (result.get("forward_only") or {}).items():
            row[f"forward_{key}"], row[f"step_{key}"] = pair["forward_only"], pair["full_step"]
        rows.append(row)
    return rows


def _float32_bytes(record: RunRecord) -> int | None:
    """Saved activations still in float32, from the calculator's terms (checked to the byte)."""
    saved = (record.annotations["workload"].get("activation_calculator") or {}).get("saved")
    if not saved:
        return None
    layer = sum(t["bytes"] for t in saved["per_layer"]["terms"] if t["dtype"] == "float32")
    outside = sum(t["bytes"] for t in saved["outside"] if t["dtype"] == "float32")
    return saved["layers"] * layer + outside


def _state_bytes(record: RunRecord) -> int | None:
    measured = record.annotations.get("measured") or {}
    parts = [measured.get(k) for k in ("parameters", "gradients", "optimizer_state")]
    known = [p for p in parts if p is not None]
    return sum(known) if len(known) == len(parts) else None


def sweep_commentary(rows: list[dict], measure: str = "live_tensors") -> list[str]:
    """Data-driven sentences: mixed precision against fp32, long against short context."""
    lines = []
    by_key = {(r["architecture"], r["sequence_length"], r["precision"]): r for r in rows}
    for (arch, seq, precision), row in by_key.items():
        base = by_key.get((arch, seq, "fp32"))
        if precision == "fp32" or base is None or not (_finished(row, measure) and _finished(base, measure)):
            continue
        lines.append(_precision_sentence(arch, seq, precision, base, row, measure))
    for arch in dict.fromkeys(r["architecture"] for r in rows):
        lines += _context_sentences([r for r in rows if r["architecture"] == arch], measure)
    return lines


def _precision_sentence(arch, seq, precision, base, row, measure) -> str:
    before, after = base[f"step_{measure}"], row[f"step_{measure}"]
    change = (after - before) / before
    saved = row["saved_activations"] - base["saved_activations"]
    copies = row.get("weight_copies") or 0
    moved = ("leaves the full-step peak unchanged" if abs(change) < 0.0005 else
             f"{'lowers' if change < 0 else 'raises'} the full-step peak by {abs(change):.1%}")
    text = (f"{arch}, sequence {seq}: {precision} {moved} ({size(before)} → {size(after)} of live "
            f"tensors, in `{row['peak_stage']}`{_rss_change(base, row)}). "
            f"Saved activations change by {signed_size(saved)} ({size(base['saved_activations'])} → "
            f"{size(row['saved_activations'])})"
            + (", not halved" if row["saved_activations"] > 0.55 * base["saved_activations"] else "")
            + f": {share(row['float32_activations'], row['saved_activations'])} of them are still "
            f"float32 (residual stream, norms, softmax, log-probabilities, as the calculator lists).")
    if copies:
        text += (f" Autocast also keeps {size(copies)} of low-precision weight copies for backward, "
                 f"so the graph holds {signed_size(saved + copies)} against fp32.")
    if precision.startswith("amp-"):
        text += (f" Parameters, gradients and optimizer state stay float32 at {size(row['state'])} "
                 f"({share(row['state'], after)} of the peak): mixed precision does not shrink them.")
    else:
        text += (f" Parameters, gradients and optimizer state are {precision} too: {size(row['state'])} "
                 f"against {size(base['state'])}.")
    forward_before, forward_after = base.get(f"forward_{measure}"), row.get(f"forward_{measure}")
    if forward_before and forward_after:
        text += (f" Forward only: {size(forward_before)} → {size(forward_after)} "
                 f"({signed_size(forward_after - forward_before)})"
                 + (", as the weight copies exist during an inference forward too." if copies and
                    forward_after > forward_before else "."))
    return text


def _rss_change(base: dict, row: dict) -> str:
    before, after = base.get("step_rss"), row.get("step_rss")
    if not before or not after:
        return ""
    return f"; peak RSS {size(before)} → {size(after)}, {(after - before) / before:+.1%}"


def _finished(row: dict, measure: str) -> bool:
    """Whether the row's configuration finished a full step (a failed or cut-off one has no figure)."""
    return bool(row.get(f"step_{measure}"))


def _context_sentences(rows: list[dict], measure: str) -> list[str]:
    lines = []
    for precision in dict.fromkeys(r["precision"] for r in rows):
        same = sorted((r for r in rows if r["precision"] == precision and r["saved_activations"]
                       and _finished(r, measure) and r.get(f"forward_{measure}")),
                      key=lambda r: r["sequence_length"])
        if len(same) < 2:
            continue
        short, long = same[0], same[-1]
        factor = long["sequence_length"] / short["sequence_length"]
        grown = long["saved_activations"] / short["saved_activations"]
        why = (f", more than {factor:g}x: attention scores grow with the square of the context"
               if grown > factor * 1.05 else "")
        lines.append(
            f"{short['architecture']}, {precision}: {factor:g}x the context ({short['sequence_length']} → "
            f"{long['sequence_length']}) makes {grown:.2f}x the saved activations{why}; the full-step "
            f"peak grows {long[f'step_{measure}'] / short[f'step_{measure}']:.2f}x and the "
            f"forward-only peak {long[f'forward_{measure}'] / short[f'forward_{measure}']:.2f}x.")
    return lines
