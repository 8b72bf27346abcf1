"""What a projection's headline may say: a traced run that ended in an error gives no headline
figure, only where it failed; a target model that is a stand-in says so beside its figure; a
scaled projection fitted on no run, or an algorithm that cannot be projected, says so as its caveat.

    failed = traced_failure(projection)          # None, or .phrase "failed at stage `prune`: ..."
    failed = traced_failure(projection, traced)  # with the traced run's own record: its stage, exactly
    note = stand_in(projection)                  # the `target_built` sentence when a stand-in, else None
    caveat = scaled_caveat(projection)           # UNCALIBRATED, why it is not projected, or None

A traced run that dies part-way still finished some stages, and the stage it died in is
finished too (status "failed"), holding whatever it had made before the error: at least the
target's weights. Its per-stage figures stay in the projection's details, said to stop there;
a headline figure (the title, the answer table's column, the terminal's line) would read as the
target's peak, which the run never reached, so none is given.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from auditor.record.derived import Projection
from auditor.record.schema import RunRecord

REASON_CHARS = 200  # the reason is one line; an error's message can be a page
_ENDED = re.compile(r" failed \(([^()]*)\)(?:: (.*))?$")  # auditor.capture.fresh_process.ChildRun.failure


@dataclass
class Failure:
    """Where a traced run stopped and why, in one line."""
    stage: str | None                        # the stage path, call numbers kept
    where: Literal["at", "after", "at or after"]  # "at or after": the record does not say which
    reason: str

    @property
    def phrase(self) -> str:
        """'failed at stage `X`: reason' (`code` spans marked with backticks)."""
        if self.stage is None:
            return f"failed before any stage: {self.reason}"
        return f"failed {self.where} stage `{self.stage}`: {self.reason}"

    @property
    def plain(self) -> str:
        return self.phrase.replace("`", "")


def traced_failure(projection: Projection, traced: RunRecord | None = None) -> Failure | None:
    """The failure of a traced projection whose run ended in an error (`incomplete`, set by
    auditor.jobs.script_projection.project_program), else None. The stage: the projection's
    `failed_stage`, else the traced run's record (`traced`: its stage that failed or was open,
    or, all finished, the failure came after the last), else the last stage the projection has,
    at or after which it failed."""
    said = projection.get("incomplete")
    if not said:
        return None
    reason = _reason(str(said))
    named = projection.get("failed_stage")
    if isinstance(named, str) and named:
        return Failure(named, "at", reason)
    stages = [s for s in projection.get("stages") or [] if "path" in s]
    if traced is not None:
        return _from_record(traced, reason)
    return Failure(stages[-1]["path"] if stages else None, "at or after", reason)


def _from_record(traced: RunRecord, reason: str) -> Failure:
    stopped = [s for s in traced.stages if s.status in ("failed", "open")]
    if stopped:  # the innermost: an error inside a nested stage fails its parents too
        deepest = max(stopped, key=lambda s: (s.path.count("/"), s.start_s))
        return Failure(deepest.path, "at", reason)
    done = [s for s in traced.stages if s.finished]
    if not done:
        return Failure(None, "at", reason)
    return Failure(max(done, key=lambda s: s.end_s or s.start_s).path, "after", reason)


def _reason(said: str) -> str:
    """'the traced run failed (exit status 1): RuntimeError: x' -> 'RuntimeError: x (exit status 1)'."""
    line = said.strip().splitlines()[0] if said.strip() else "reason unknown"
    ended = _ENDED.search(line)
    if ended is not None:
        how, last = ended.group(1), ended.group(2)
        line = f"{last} ({how})" if last else how
    line = line.replace("`", "'")
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS].rsplit(" ", 1)[0] + " ..."


def stand_in(projection: Projection) -> str | None:
    """The sentence saying the target model is a stand-in architecture (`target_built`, set by
    auditor.jobs.script_projection), else None (built by the program, or an older record)."""
    built = projection.get("target_built")
    if not isinstance(built, dict) or built.get("by") != "stand-in":
        return None
    says = built.get("says")
    if says:
        return str(says).strip().rstrip(".")
    return "the target model is a stand-in architecture, not the program's own"


UNCALIBRATED = ("uncalibrated: each quantity grown by an assumed driver (transients by parameters, "
                "unseen tensors by activations), fitted on no run; it can be off by several times, "
                "so trust the traced projection (a run without --no-trace calibrates this one)")


def scaled_caveat(item: Projection) -> str | None:
    """A projection of an algorithm that cannot be projected says why (`not_projected`); a scaled
    projection made without calibration runs says so (`fit.runs` empty)."""
    if item.get("not_projected"):
        return str(item["not_projected"])
    fit = item.get("fit")
    if item.get("method", "scaled") != "scaled" or not isinstance(fit, dict):
        return None
    return UNCALIBRATED if not fit.get("runs") else None
