"""The comparison report's content: everything the comparison report and its chart say, computed
once from the comparison record and its summary (auditor.comparison.verdict.summarise).

    report = comparison_report(record, summary)
    report.failed, report.sides[0].peak_rss.median, report.variants[0].peak_ratio, ...

Numbers, names and words of the record and summary, never markdown: auditor.renderers.
comparison_markdown only formats it and comparison_chart draws from it. Bytes and seconds.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from auditor.analysis.run.source_paths import shown_command

Scalar = int | float | str | bool | None


# -- the model -----------------------------------------------------------------------------

@dataclass
class Spread:
    """min / median / max over a side's runs."""
    min: float
    median: float
    max: float
    n: int


@dataclass
class Environment:
    """The machine and software the comparison ran on, with its load."""
    python: str
    executable: str                       # the interpreter's file name
    platform: str
    cpu: str | None
    cpu_count: int | None
    cpus_usable: int | None
    memory_total: int | None
    libraries: dict[str, str | None]      # name -> version; None: not installed
    thread_variables: dict[str, str]
    load_start: list[float]               # load average over 1 / 5 / 15 min
    load_end: list[float] | None

    @property
    def cpus(self) -> int | None:
        return self.cpus_usable or self.cpu_count


@dataclass
class Setting:
    """How the runs were made."""
    created_at: str
    repeats: int                          # runs per side
    order: list[str]                      # the sides in the order each round runs them
    busy: bool                            # other work at the start: times are noisy


@dataclass
class Side:
    """A side's runs, min / median / max (None: no run gave the reading)."""
    name: str
    marked_baseline: bool                 # the baseline, named otherwise than "baseline"
    runs: int
    peak_rss: Spread | None
    loaded_rss: Spread | None
    overhead: Spread | None               # peak RSS over loaded, run by run
    wall_s: Spread | None
    cpu_s: Spread | None


@dataclass
class Variant:
    """A variant against the baseline: ratios of the medians, savings, agreement, verdict."""
    name: str
    failed: bool
    why: str
    peak_ratio: float | None
    overhead_ratio: float | None
    wall_ratio: float | None
    cpu_ratio: float | None
    peak_saving: float | None             # the baseline's median minus the variant's
    overhead_saving: float | None
    noise_margin: float | None
    noise: str | None                     # "saves" | "uses more" | "within noise" | "cannot tell"; None: no peaks
    claims_saving: bool
    same_digest: bool | None
    differing_elements: int | None
    total_elements: int | None
    tolerance: str
    tolerance_source: str                 # "default" | "given" | "declared by the run"
    agreement: str                        # "identical" | "within tolerance" | "differs" | "unknown"


@dataclass
class Repeats:
    """The baseline's own repeats against its first run."""
    status: str
    reason: str

    @property
    def disagree(self) -> bool:
        return self.status not in ("identical", "unknown")


@dataclass
class Commands:
    command: str | None                   # the comparison's own, as shown
    sides: list[tuple[str, str]]          # (side, its command as shown)
    reference: str                        # the run every result is compared with


@dataclass
class Run:
    order: int
    side: str
    repeat: int
    started_at: str
    load_1min: float
    peak_rss: int
    loaded_rss: int | None
    overhead: int | None                  # peak RSS over loaded
    wall_s: float
    cpu_s: float | None
    digest: str | None                    # None: no result
    differing_elements: int | None
    agreement: str                        # its result against the reference run's, in words


@dataclass
class ReportedField:
    name: str                             # dotted path into what the run reported
    in_bytes: bool
    values: list[Scalar]                  # per side, in the sides' order


@dataclass
class Reported:
    """Scalar fields each side reported about itself, from its first run."""
    sides: list[str]
    fields: list[ReportedField]


@dataclass
class ComparisonReport:
    name: str
    failed: bool
    rule: str | None                      # how a saving is counted
    setting: Setting
    sides: list[Side]                     # in the record's order
    variants: list[Variant]
    baseline_repeats: Repeats | None      # None: one baseline run
    commands: Commands
    runs: list[Run]                       # in the order they ran
    reported: Reported
    environment: Environment


# -- making it -----------------------------------------------------------------------------

def comparison_report(record: dict, summary: dict) -> ComparisonReport:
    """Everything the comparison report says (a pure function of the record and its summary)."""
    environment = _environment(record["environment"])
    repeatable = summary["baseline_repeatable"]
    return ComparisonReport(
        name=record["name"], failed=summary["failed"], rule=summary.get("rule"),
        setting=_setting(record, environment), sides=[_side(side, summary) for side in record["sides"]],
        variants=[_variant(v) for v in summary["variants"]],
        baseline_repeats=None if repeatable is None else Repeats(repeatable["status"], repeatable["reason"]),
        commands=_commands(record), runs=[finished_run(run) for run in record["runs"]],
        reported=_reported(record), environment=environment)


def _environment(env: dict) -> Environment:
    return Environment(
        python=env["python"], executable=os.path.basename(env["executable"]), platform=env["platform"],
        cpu=env.get("cpu"), cpu_count=env.get("cpu_count"), cpus_usable=env.get("cpus_usable"),
        memory_total=env.get("memory_total"), libraries=env["libraries"],
        thread_variables=env.get("thread_variables") or {},
        load_start=env["load_average_start"], load_end=env.get("load_average_end"))


def _setting(record: dict, environment: Environment) -> Setting:
    busy = environment.load_start[0] / max(1, environment.cpus or 1)  # later readings include the runs themselves
    return Setting(created_at=record["created_at"], repeats=record["repeats"],
                   order=[side["name"] for side in record["sides"]], busy=busy >= 0.5)


def _spread(spread: dict | None) -> Spread | None:
    return None if spread is None else Spread(spread["min"], spread["median"], spread["max"], spread["n"])


def _side(side: dict, summary: dict) -> Side:
    s = summary["sides"][side["name"]]
    return Side(name=side["name"], marked_baseline=side["role"] == "baseline" and side["name"] != "baseline",
                runs=s["runs"], peak_rss=_spread(s["peak_rss"]), loaded_rss=_spread(s["loaded_rss"]),
                overhead=_spread(s["overhead"]), wall_s=_spread(s["wall_s"]), cpu_s=_spread(s["cpu_s"]))


def _variant(v: dict) -> Variant:
    a, noise = v["agreement"], v.get("noise")
    return Variant(
        name=v["name"], failed=v["verdict"] == "fail", why=v["why"], peak_ratio=v["peak_ratio"],
        overhead_ratio=v.get("overhead_ratio"), wall_ratio=v.get("wall_ratio"), cpu_ratio=v.get("cpu_ratio"),
        peak_saving=v["peak_saving"], overhead_saving=v["overhead_saving"],
        noise_margin=(noise or {}).get("margin"), noise=None if noise is None else noise["status"],
        claims_saving=v["claims_saving"], same_digest=a["same_digest"],
        differing_elements=a["differing_elements"], total_elements=a["total_elements"],
        tolerance=a["tolerance"], tolerance_source=v["tolerance_source"], agreement=a["status"])


def _commands(record: dict) -> Commands:
    return Commands(command=shown_command(record["command"], None) if record.get("command") else None,
                    sides=[(side["name"], shown_command(shlex.join(side["command"]), None))
                           for side in record["sides"]],
                    reference=record["reference"])


def finished_run(run: dict) -> Run:
    """One entry of the comparison record's `runs` (the terminal prints each as it ends)."""
    result = run.get("result")
    agreement = ("no result" if not result else
                 "reference result" if run["order"] == 1 else
                 f"{result['differing_elements']:,} elements differ" if result["differing_elements"] is not None
                 else ("same digest" if result.get("same_as_reference") else "digest differs"))
    return Run(order=run["order"], side=run["side"], repeat=run["repeat"], started_at=run["started_at"],
               load_1min=run["load_average"][0], peak_rss=run["peak_rss"], loaded_rss=run.get("loaded_rss"),
               overhead=None if run.get("loaded_rss") is None else run["peak_rss"] - run["loaded_rss"],
               wall_s=run["wall_s"], cpu_s=run.get("cpu_s"),
               digest=result["digest"] if result else None,
               differing_elements=result["differing_elements"] if result else None, agreement=agreement)


def _reported(record: dict) -> Reported:
    names = [side["name"] for side in record["sides"]]
    firsts = {run["side"]: _flatten(run.get("reported") or {}) for run in reversed(record["runs"])}
    keys: list[str] = []
    for name in names:
        keys += [key for key in firsts.get(name, {}) if key not in keys]
    return Reported(names, [ReportedField(key, "rss" in key.rsplit(".", 1)[-1] or key.endswith("_bytes"),
                                          [firsts.get(name, {}).get(key) for name in names]) for key in keys])


def _flatten(data: dict, prefix: str = "") -> dict[str, Scalar]:
    flat: dict[str, Scalar] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float, str, bool)) or value is None:
            flat[f"{prefix}{key}"] = value
    return flat
