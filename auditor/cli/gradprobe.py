"""`auditor gradprobe`: the main job. Audits GradProbe on an architecture, projects it to
7B-scale targets (scaled and traced) and writes the markdown memory report.

    auditor gradprobe --arch tinystories-33m --target mistral-7b -o reports/gradprobe-tinystories-33m.md

Exit status: 0 done; 1 a calibration or traced run failed; 2 bad input (a --run-dir must be
new or empty); 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP. On 1 and on a signal the report holds what
finished.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from architectures.options import (
    add_device_argument,
    add_size_arguments,
    add_threads_argument,
    check_sequence_length,
    size_overrides,
)
from auditor.cli import (
    BAD_INPUT,
    UsageError,
    add_memray_switch,
    add_output_argument,
    add_run_dir_argument,
    check_writable_report,
    epilog,
)
from auditor.cli.job_options import add_gradprobe_options, check_gradprobe_options, gradprobe_settings, take_defaults
from auditor.cli.progress import StatusLine, run_reader, stage_reader
from auditor.cli.report_name import default_report_path, defaults_of
from auditor.cli.stopping import job_command
from auditor.jobs.settings import GradProbeSettings
from auditor.record.schema import RunRecord

DEFAULT_TARGETS = ["mistral-7b"]


def register(subparsers) -> None:
    p = subparsers.add_parser("gradprobe", help="audit GradProbe and write the memory report",
                              description=__doc__.split("\n\n")[0],
                              epilog=epilog(["auditor gradprobe --arch tinystories-33m --target mistral-7b",
                                             "auditor gradprobe --variant lean --layers 2 -o lean.md"],
                                            [(0, "done"), (1, "a calibration or traced run failed (the report "
                                                                 "holds what finished)"), BAD_INPUT,
                                             (130, "Ctrl-C (the report holds what finished)"),
                                             (143, "SIGTERM (129 SIGHUP): as Ctrl-C, every child ended")]))
    p.add_argument("--arch", help="architecture name or checkpoint folder")
    add_size_arguments(p)
    add_gradprobe_options(p)
    add_device_argument(p)
    p.add_argument("--target", action="append", dest="targets", metavar="ARCH",
                   help=f"architecture to project to (repeatable) (default: {DEFAULT_TARGETS[0]})")
    p.add_argument("--no-trace", action="store_true",
                   help="scaled projection only: no traced run, and no calibration runs, so the scaled "
                        "figures are uncalibrated (the report says so)")
    add_memray_switch(p)  # on by default: it costs about 2 s here and names the lines behind the peak
    add_threads_argument(p)
    add_run_dir_argument(p, "folder for the run record (default: a new folder under runs/)")
    add_output_argument(p, "report path (default: reports/gradprobe-ARCH.md, plus every setting that "
                           "differs from its default: -layers1-lean...)", metavar="REPORT.md")
    take_defaults(p, GradProbeSettings)
    p.set_defaults(handler=main)
    p.set_defaults(setting_defaults=defaults_of(p))


@job_command
def main(args) -> int:
    from auditor.cli.run_dir import check_new_run_dir
    check_new_run_dir(args.run_dir)  # before torch is imported: one line, at once
    settings, targets, output = _checked(args)
    # The libraries load before the audit, so their import (and, with memray on, its
    # tracking of every import-time allocation) counts in no stage of the algorithm.
    import torch
    import transformers  # noqa: F401

    import gradprobe.variants  # noqa: F401
    from auditor.capture.audit import new_run_folder

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(args.run_dir) if args.run_dir else new_run_folder(f"gradprobe-{args.arch}")
    projections: list[dict] = []
    try:
        record = _audit(args, settings, targets, folder, projections)
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: a calibration child's group ended
        from auditor.capture.process_group import exit_status, interruption
        return _partial(folder, output, projections, interruption(stop), exit_status(stop))
    except RuntimeError as error:  # a child that failed (calibration, tracing): how it ended
        return _partial(folder, output, projections, str(error), 1)
    record.annotations["projections"] = projections
    _write(record, folder, output)
    _print_summary(record, output, folder)
    return 0


def _audit(args, settings, targets, folder: Path, projections: list) -> RunRecord:
    """The real run, calibration, then each target's projections (appended as they come)."""
    from auditor.analysis.projection.scaled import project
    from auditor.analysis.projection.traced import project_traced
    from auditor.jobs import gradprobe as job

    with StatusLine() as advance:
        advance("auditing the real run")
        record = job.audit(settings, folder, memray=args.memray,
                           on_stage_end=advance.stage_ended)
        if not args.no_trace:  # small traced runs that let the scaled projection fit its drivers
            from auditor.jobs.calibration import calibrate, perturbations
            advance("calibrating the scaled projection (small traced runs)")
            with advance.follow(run_reader(folder / "calibration", "compact.json"), len(perturbations(settings)),
                                unit="runs"):
                record.annotations["calibration"] = calibrate(
                    settings, folder / "calibration", observed_sizes=record.annotations.get("data_dependent_sizes"))
        for target in targets:
            advance(f"projecting to {target} (scaled)")
            projections.append(project(record, target))
            if not args.no_trace:
                advance(f"tracing {target} on fake tensors")
                with advance.follow(stage_reader(folder / f"traced-{target}", top_level=True),
                                    sum(stage.parent is None for stage in record.stages), unit="top-level stages"):
                    traced = job.traced_audit(replace(settings, architecture=target, overrides={}),
                                              folder / f"traced-{target}",
                                              observed_sizes=record.annotations.get("data_dependent_sizes"))
                projections.append(project_traced(record, traced))
    return record


def _write(record: RunRecord, folder: Path, output: Path) -> None:
    """The derived results beside run.json (which stays the audit's own), then the report."""
    from auditor.record.run_folder import DERIVED_FILES, write_derived
    from auditor.renderers import markdown
    from auditor.report_models.run import run_report
    for key in DERIVED_FILES:
        if key in record.annotations:
            write_derived(folder, key, record.annotations[key])
    markdown.write(run_report(record), output, run_folder=folder)


def _partial(folder: Path, output: Path, projections: list, why: str, status: int) -> int:
    """Ctrl-C (or SIGTERM, SIGHUP) or a failed child: a report of what finished (the record says
    how the audited run ended), `why` on stderr, `status` (128 + the signal, 1 failed)."""
    import sys

    from auditor.capture.fresh_process import recovered_record
    record = recovered_record(folder)
    if record is None:
        print(f"auditor: {why} before the run began; nothing written", file=sys.stderr)
        return status
    record.annotations["projections"] = projections
    if record.exit is not None and record.exit.status == "ok":  # the audit had finished; projections not
        record.warnings.append(f"{why} after the audit: {len(projections)} projection(s) made before it")
    _write(record, folder, output)
    print(f"auditor: {why}; partial report: {output}\nrun record: {folder / 'run.json'}",
          file=sys.stderr)
    return status


def _checked(args):
    """Every argument validated before anything runs (torch only for the Settings, once all is
    checked): bad input is one line, exit 2."""
    import architectures

    targets = args.targets or DEFAULT_TARGETS
    try:
        check_gradprobe_options(args)
        for i, target in enumerate(targets):
            if target in targets[:i]:
                raise ValueError(f"--target {target} is given twice; each target is projected once")
            try:
                architectures.config_fields(target)
            except architectures.UnknownArchitecture as error:
                raise ValueError(f"--target: {error}") from None
            if not args.no_trace:  # the traced projection runs the target at this length
                check_sequence_length(target, args.seq_len)
    except ValueError as error:
        raise UsageError(str(error)) from None
    output = Path(args.output) if args.output is not None else _default_output(args, targets)
    check_writable_report(output, create_folder=args.output is None)
    settings = gradprobe_settings(args, size_overrides(args))
    output.parent.mkdir(parents=True, exist_ok=True)
    return settings, targets, output


# Where and how fast the job runs, not what it measures: they leave the report's name alone.
_NOT_IN_THE_NAME = ("handler", "arch", "threads", "run_dir", "output")


def _default_output(args, targets: list[str]) -> Path:
    settings = {k: getattr(args, k) for k in args.setting_defaults if k not in _NOT_IN_THE_NAME}
    defaults = dict(args.setting_defaults, targets=DEFAULT_TARGETS)
    return default_report_path("gradprobe", [args.arch], dict(settings, targets=targets), defaults)


def _print_summary(record: RunRecord, output: Path, folder: Path) -> None:
    from auditor.analysis.projection.estimated_bytes import estimate_note
    from auditor.analysis.projection.standing import scaled_caveat
    from auditor.analysis.projection.views import projection_views
    from auditor.facts.units import size
    print(f"peak RSS {size(record.peak.rss)} in {record.peak.stage}")
    views = {(v.method, v.target, v.target_dtype): v for v in projection_views(record)}  # held to the traced one
    for p in record.annotations.get("projections", []):
        view = views.get((p.get("method", "scaled"), str(p.get("target")), p.get("target_dtype")))
        if p.get("not_projected"):
            print(f"{p['method']:>6} projection to {p['target']}: none ({p['not_projected']})")
        elif p.get("explained") is False:  # no number its drivers do not explain
            miss = p.get("miss") or {}
            print(f"{p['method']:>6} projection to {p['target']}: not explained by its drivers (miss "
                  f"{size(miss.get('bytes'))} in {miss.get('stage')}): see traced")
        elif view is not None and view.withheld:  # its figures are in the report's details
            print(f"{p['method']:>6} projection to {p['target']}: {view.withheld}")
        elif p.get("peak"):
            caveat = "; ".join(c for c in (scaled_caveat(p), view.unchecked if view is not None else None) if c)
            print(f"{p['method']:>6} projection to {p['target']}: peak RSS {size(p['peak']['rss'])}, "
                  f"live tensors {size(p['live_tensor_peak'])}" + (f" ({caveat})" if caveat else ""))
            if estimate_note(p):
                print(f"       {estimate_note(p)}")
    print(f"report: {output}\nrun record: {folder / 'run.json'}")
