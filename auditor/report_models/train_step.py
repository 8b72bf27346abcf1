"""The training-step report's content: everything the sweep report says, computed once from the
records of its configurations (auditor.jobs.train_step).

    report = train_step_report(records)      # one record per configuration, in sweep order
    report.sweep.rows, report.configurations[0].study.components, report.environment, ...

Parts in the report's order: intro, the sweep table with its commentary, one part per
configuration (components, activation calculator, one step against many, leak/spike/stable,
largest allocations), the first configuration's environment. They hold numbers, names and
sentences, never markdown: auditor.renderers.train_step_markdown and train_step_chart only
format it. Where the records lie (the run folders the report links to) is the renderer's
business.
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.analysis.training import step as training
from auditor.record.schema import RunRecord
from auditor.report_models.run import Environment, Sites, environment, sites

MEASURES = training.MEASURES  # measure key -> its label ("live tensors", "RSS", "CUDA allocated")


# -- the model -----------------------------------------------------------------------------

@dataclass
class Intro:
    """The settings the sweep shares, as its first configuration ran them."""
    device: str
    batch_size: int
    accumulation: int
    steps: int                 # steps asked for
    optimizer: str
    seed: int
    sweep_command: str | None  # the command every record names as its sweep's; None: they differ


@dataclass
class SweepRow:
    """One configuration's line of the sweep table."""
    architecture: str
    sequence_length: int
    precision: str
    ending: str | None         # how it ended when it did not finish
    forward: dict[str, int]    # measure -> the forward-only peak (measures both have)
    step: dict[str, int]       # measure -> the full-step peak
    saved_activations: int | None


@dataclass
class Sweep:
    rows: list[SweepRow]
    commentary: list[str]      # sentences comparing precisions and context lengths


@dataclass
class Component:
    """A component of one step, measured against what the config says it should be."""
    name: str
    measured: int | None
    expected: int | None       # None: the config does not say
    exact: bool | None         # measured == expected; None when either is unknown
    how: str


@dataclass
class ActivationCheck:
    """Saved-tensor accounting against the live tensors the first forward left behind."""
    saved: int
    live_growth: int
    difference: int
    relative: float | None
    within_tolerance: bool
    tolerance: float


@dataclass
class NoFormula:
    """The activation calculator has no formula for this model."""
    why: str


@dataclass
class Calculator:
    """The config-only activation calculator against the saved-tensor hooks."""
    residual_stream: str       # derivation of one residual-stream tensor
    layer_family: str
    layer_derivation: str      # what one decoder layer saves for backward
    whole_derivation: str      # the whole model
    computed_per_layer: int
    measured_layers: list[int]
    computed_total: int
    measured_total: int
    computed_weight_copies: int
    measured_weight_copies: int


@dataclass
class OneAgainstMany:
    """One measure: the components summed, step 1's peak and the peak over every step."""
    measure: str               # its label
    summed: int | None         # live tensors only
    first_step: int
    all_steps: int


@dataclass
class Stability:
    measure: str               # its label
    verdict: str               # leak, spike, stable, too short
    evidence: str


@dataclass
class ForwardOnly:
    """A measure's peak: one inference forward against the full step."""
    forward_only: int
    full_step: int


@dataclass
class Study:
    """What the finished steps of one configuration show."""
    components: list[Component]
    activation_check: ActivationCheck | None
    calculator: Calculator | NoFormula | None
    steps: list[int]                    # finished step numbers
    series: dict[str, list[int]]        # measure -> each step's peak (measures with readings)
    peak_stages: list[str]              # per step: the stage where live tensors peaked
    one_against_many: list[OneAgainstMany]
    explanations: list[str]             # why one step's breakdown and the peak over many differ
    stability: list[Stability]
    forward_only: dict[str, ForwardOnly]


@dataclass
class Unfinished:
    """How a configuration that did not finish ended, and which stages it got through."""
    ending: str                # "killed by SIGKILL: out of memory?"
    finished: list[str]        # top-level stages that ended ok
    cut: list[str]             # stages that failed or stayed open


@dataclass
class Configuration:
    architecture: str
    sequence_length: int
    precision: str
    unfinished: Unfinished | None  # None: it finished
    study: Study | None            # None: no training step finished
    sites: Sites                   # memray's largest allocations at its high-water mark
    cuda_history: str | None       # the CUDA allocation history file, in its run folder


@dataclass
class TrainStepReport:
    """The training-step report of a sweep, part by part."""
    architectures: list[str]       # each once, in sweep order
    intro: Intro
    sweep: Sweep
    configurations: list[Configuration]
    environment: Environment       # the first configuration's


# -- making it -----------------------------------------------------------------------------

def train_step_report(records: list[RunRecord]) -> TrainStepReport:
    """Everything the training-step report says about `records`, one per configuration in
    sweep order (a pure function of them)."""
    return TrainStepReport(
        architectures=list(dict.fromkeys(_settings(r)["architecture"] for r in records)),
        intro=_intro(records), sweep=_sweep(records),
        configurations=[_configuration(r) for r in records], environment=environment(records[0]))


def _settings(record: RunRecord) -> dict:
    """The configuration the train-step job ran (its `workload` annotation)."""
    return record.annotations["workload"]["settings"]


def _intro(records: list[RunRecord]) -> Intro:
    s = _settings(records[0])
    sweeps = {r.annotations["workload"].get("sweep_command") for r in records}
    return Intro(device=records[0].device, batch_size=s["batch_size"], accumulation=s["accumulation"],
                 steps=s["steps"], optimizer=s["optimizer"], seed=s["seed"],
                 sweep_command=sweeps.pop() if len(sweeps) == 1 and None not in sweeps else None)


def _sweep(records: list[RunRecord]) -> Sweep:
    rows = training.sweep_rows(records)
    return Sweep([_sweep_row(row, record) for row, record in zip(rows, records, strict=False)],
                 training.sweep_commentary(rows))


def _sweep_row(row: dict, record: RunRecord) -> SweepRow:
    return SweepRow(architecture=row["architecture"], sequence_length=row["sequence_length"],
                    precision=row["precision"], ending=None if row["complete"] else _ending(record),
                    forward={k: row[f"forward_{k}"] for k in MEASURES if f"forward_{k}" in row},
                    step={k: row[f"step_{k}"] for k in MEASURES if f"step_{k}" in row},
                    saved_activations=row["saved_activations"])


def _configuration(record: RunRecord) -> Configuration:
    s = _settings(record)
    result = training.study(record)
    return Configuration(
        architecture=s["architecture"], sequence_length=s["sequence_length"], precision=s["precision"],
        unfinished=None if result["complete"] else _unfinished(record),
        study=_study(record, result) if result.get("components") else None,
        sites=sites(record), cuda_history=(record.files or {}).get("cuda_history"))


def _ending(record: RunRecord) -> str:
    """How a configuration that did not finish ended: "killed by SIGKILL: out of memory?"."""
    exit_ = record.exit
    error = (exit_.error if exit_ is not None else None) or ""
    if exit_ is not None and exit_.status == "interrupted" and not error.startswith("interrupted"):
        return f"interrupted ({error})" if error else "interrupted"
    return error or "the run did not finish"


def _unfinished(record: RunRecord) -> Unfinished:
    return Unfinished(_ending(record),
                      finished=[s.path for s in record.stages if s.status == "ok" and s.parent is None],
                      cut=[s.path for s in record.stages if s.status != "ok"])


def _study(record: RunRecord, result: dict) -> Study:
    """`result`: training.study(record) of a record with a finished step."""
    check = result["activation_check"]
    return Study(
        components=[Component(r["name"], r["measured"], r["expected"], r["exact"], r["how"])
                    for r in result["components"]],
        activation_check=ActivationCheck(**check) if check else None,
        calculator=_calculator(result["calculator"]), steps=result["steps"], series=result["series"],
        peak_stages=[training.peak_stage_name(record, number) for number in result["steps"]],
        one_against_many=[OneAgainstMany(r["measure"], r["summed"], r["first_step"], r["all_steps"])
                          for r in result["one_against_many"]],
        explanations=result["explanations"],
        stability=[Stability(MEASURES[key], v["verdict"], v["evidence"]) for key, v in result["stability"].items()],
        forward_only={k: ForwardOnly(v["forward_only"], v["full_step"]) for k, v in result["forward_only"].items()})


def _calculator(calc: dict | None) -> Calculator | NoFormula | None:
    if not calc:
        return None
    if "unavailable" in calc:
        return NoFormula(calc["unavailable"])
    saved = calc["saved"]
    return Calculator(
        residual_stream=calc["residual_stream"]["derivation"], layer_family=saved["per_layer"]["family"],
        layer_derivation=saved["per_layer"]["derivation"], whole_derivation=saved["derivation"],
        computed_per_layer=calc["computed_per_layer"], measured_layers=calc["measured_layers"],
        computed_total=calc["computed_total"], measured_total=calc["measured_total"],
        computed_weight_copies=calc["computed_weight_copies"], measured_weight_copies=calc["measured_weight_copies"])
