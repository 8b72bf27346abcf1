"""The same GradProbe configuration on two devices (CPU against CUDA), from the run records of
`auditor gradprobe --device ...` alone: per run its peak RSS, the CUDA allocator's peak
allocated and largest reserved, its time, and whether the masks agree within each device.

    report = device_side_by_side([load(folder) for folder in folders], sources)
    report.runs, report.devices, report.problems

Masks are compared by the digest the job records (`result.mask_digest`, gradprobe's sha256
over every mask's bits). Within a device, every variant of one configuration should prune the
same weights (the exact variants promise the baseline's masks); across devices they may differ,
since CUDA kernels sum gradients in another order: that is said, never counted as a failure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from auditor.analysis.projection.standing import scaled_caveat
from auditor.record import derived
from auditor.record.schema import RunRecord

# Settings that may differ between the runs compared: what the report sets side by side.
SIDE_SETTINGS = ("device", "variant")


class SideBySideError(ValueError):
    """Records that cannot be set side by side (one line: what is wrong)."""


@dataclass
class DeviceRun:
    source: str                 # where the record was read (a run folder, as given)
    device: str                 # "cpu" or "cuda..." as the job was asked for
    device_name: str            # what the record says ran it ("cuda:0 (NVIDIA H200)")
    variant: str
    status: str                 # the run's exit status
    peak_rss: int | None
    peak_place: str | None      # the stage path holding the peak RSS, or "after STAGE (unstaged)"
    cuda_peak_allocated: int | None   # highest over the stages; None: no CUDA readings
    cuda_reserved: int | None         # largest reserved at any stage end
    cuda_allocated_end: int | None    # allocated at the end of the last stage
    prune_s: float | None             # the `prune` stage's own time
    duration_s: float | None          # the whole audited run
    mask_digest: str | None           # None: the record has none (an older job, or a failed run)
    pruned: int | None
    projected_peak: dict[str, int] = field(default_factory=dict)  # "traced mistral-7b" -> live tensors
    projection_caveats: dict[str, str] = field(default_factory=dict)  # what a projection rests on

    @property
    def side(self) -> str:
        return "cpu" if self.device == "cpu" else "cuda"


@dataclass
class DeviceMasks:
    device: str
    identical: bool | None      # None: a run has no digest, so nothing can be said
    variants: list[str]
    digests: int                # distinct digests among the runs with one
    missing: list[str]          # the variants whose record holds no digest


@dataclass
class DeviceSideBySide:
    configuration: dict          # the settings every run shares
    runs: list[DeviceRun]
    devices: list[DeviceMasks]
    across_devices: bool | None  # the same digest on every device (None: not every run has one)
    environment: dict[str, str]  # device -> what ran it (torch version, machine)
    problems: list[str] = field(default_factory=list)  # failed runs, missing digests: said in the report


def device_side_by_side(records: list[RunRecord], sources: list[str]) -> DeviceSideBySide:
    """The runs set side by side; SideBySideError if they are not one configuration."""
    if not records:
        raise SideBySideError("no run records given")
    settings = [_settings(record, source) for record, source in zip(records, sources, strict=False)]
    shared = {k: v for k, v in settings[0].items() if k not in SIDE_SETTINGS}
    for setting, source in zip(settings[1:], sources[1:], strict=False):
        differs = sorted(k for k in set(shared) | set(setting)
                         if k not in SIDE_SETTINGS and setting.get(k) != shared.get(k))
        if differs:
            raise SideBySideError(f"{source} is another configuration than {sources[0]}: "
                                  + ", ".join(f"{k} {setting.get(k)!r} against {shared.get(k)!r}" for k in differs))
    runs = [_run(record, source, setting) for record, source, setting in zip(records, sources, settings, strict=False)]
    # CPU first, then the GPU; a device's runs in the order given (a variant run twice is a repeat)
    runs.sort(key=lambda run: (run.side != "cpu", run.device))
    devices = [_masks(device, [run for run in runs if run.device == device])
               for device in dict.fromkeys(run.device for run in runs)]
    digests = [run.mask_digest for run in runs]
    across = None if None in digests or len(devices) < 2 else len(set(digests)) == 1
    problems = [f"{run.variant} on {run.device} ended {run.status}: its figures are those of a run cut short"
                for run in runs if run.status != "ok"]
    problems += [f"{run.variant} on {run.device}: the record holds no mask digest, so its masks are not compared"
                 for run in runs if run.mask_digest is None]
    environment: dict[str, str] = {}
    for record, run in zip(records, runs, strict=False):
        environment.setdefault(run.device, _environment(record))
    return DeviceSideBySide(shared, runs, devices, across, environment, problems)


def _settings(record: RunRecord, source: str) -> dict:
    workload = record.annotations.get("workload")
    settings = workload.get("settings") if isinstance(workload, dict) else None
    if not isinstance(settings, dict) or "variant" not in settings or "device" not in settings:
        raise SideBySideError(f"{source} is not a run record of `auditor gradprobe` (no workload settings)")
    return settings


def _run(record: RunRecord, source: str, settings: dict) -> DeviceRun:
    cuda = [stage.cuda for stage in record.stages if stage.cuda is not None]
    ended = [stage for stage in record.stages if stage.cuda is not None and stage.end_s is not None]
    prune = next((stage for stage in record.stages if stage.path == "prune"), None)
    result = record.annotations.get("result") or {}
    projected, caveats = {}, {}
    for projection in derived.projections(record.annotations.get("projections")):
        peak = projection.get("live_tensor_peak")
        if peak is not None:
            key = f"{projection.get('method')} {projection.get('target')}"
            projected[key] = peak
            if scaled_caveat(projection):
                caveats[key] = str(scaled_caveat(projection))
    return DeviceRun(
        source=source, device=settings["device"], device_name=record.device, variant=settings["variant"],
        status=record.exit.status if record.exit is not None else "unfinished",
        peak_rss=record.peak.rss, peak_place=_peak_place(record),
        cuda_peak_allocated=_most(c.peak_allocated for c in cuda),
        cuda_reserved=_most(c.reserved_end for c in cuda),
        cuda_allocated_end=max(ended, key=lambda s: s.end_s or 0.0).cuda.allocated_end if ended else None,  # type: ignore[union-attr]
        prune_s=(prune.end_s - prune.start_s) if prune is not None and prune.end_s is not None else None,
        duration_s=record.duration_s, mask_digest=result.get("mask_digest"), pruned=result.get("pruned"),
        projected_peak=projected, projection_caveats=caveats)


def _peak_place(record: RunRecord) -> str | None:
    where = record.peak.where
    if record.peak.stage is None and where is not None and where.kind == "unstaged":
        return f"after {where.after} (unstaged)" if where.after else "outside any stage"
    return record.peak.stage


def _most(values) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _masks(device: str, runs: list[DeviceRun]) -> DeviceMasks:
    missing = [run.variant for run in runs if run.mask_digest is None]
    distinct = {run.mask_digest for run in runs if run.mask_digest is not None}
    return DeviceMasks(device=device, identical=None if missing else len(distinct) == 1,
                       variants=[run.variant for run in runs], digests=len(distinct), missing=missing)


def _environment(record: RunRecord) -> str:
    env, machine = record.environment, record.machine
    parts = [record.device, f"torch {env.torch}" if env.torch else None,
             f"{machine.cpus} CPUs" if machine is not None and machine.cpus else None,
             f"{env.threads} threads" if env.threads else None]
    return ", ".join(part for part in parts if part)
