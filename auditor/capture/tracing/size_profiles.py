"""Where in a run each data-dependent size fell, and its replay in a traced run by relative position.

A site's aggregate ratio (total elements out over total in, auditor.capture.tracing.data_dependent) keeps what
the calls add up to right, but not any one call: a mask's chunks are not equally dense (one
22% true, the next 2%), and a stage's live-tensor peak rests on the call it was making at that
moment. So the real run also keeps, per call site, operator and stage path, its calls in order
(`Profile`: elements in and out, adjacent calls merged past `MAX_POINTS`), and the traced run
sizes each call by the real calls at the same relative position (`Replay`).

Relative position is measured in elements in: the traced run's calls at a site in a stage path,
elements x to x + n, stand for the real calls between x / g and (x + n) / g, and take as many
elements out as those did, times g; past the real calls' end, the path's aggregate ratio. So
more layers or more chunks stretch the real sequence, as a larger model stretches the real
loops, and each call gets the density of the real calls at its place.

The growth g, fixed at a path's first call, is the smallest of: how much more input the traced
run gave every site, and this site, in stage instances that have ended (each paired with the
real run's instance of the same path and order); this first call's input over the real path's
first call's; and the live tensors' bytes at that call over the real run's at its first call
there. A g at or below the truth keeps the path's total at its aggregate ratio exactly (the
real calls are all used, the rest at the ratio: state summed over calls stays right); only a g
above it would leave their end unused (a first call that grew more than the rest, as an
embedding does when the vocabulary grows most), so the smallest is taken. With no growth known
(no stage has ended, no live-tensor meter, and the first calls are the same size, as
fixed-size chunks are) the path's aggregate ratio sizes every call. Either way each size is
an estimate, and the traced record counts the calls sized by replay (`replayed_calls`).
"""
from __future__ import annotations

from bisect import bisect_right

MAX_POINTS = 256      # calls kept per site and path; past it, adjacent calls are merged in pairs
MAX_INSTANCES = 4096  # stage instances per site and path whose input is kept for pairing


class Profile:
    """One site's calls of one operator in one stage path, in order: [elements in, out] per
    point (a point is `bucket` consecutive calls), the input of each stage instance, and the
    live-tensor bytes at the first call (`live`, None without the meter)."""
    __slots__ = ("points", "bucket", "pending", "instances", "last", "counted", "live")

    def __init__(self, live: int | None = None) -> None:
        self.live = live
        self.points: list[list[int]] = []
        self.bucket, self.pending = 1, [0, 0, 0]  # in, out, calls not yet a point
        self.instances: list[int] = []
        self.last, self.counted = None, False

    def add(self, instance, numel_in: int, numel_out: int) -> None:
        if instance != self.last or not self.instances:
            self.last, self.counted = instance, len(self.instances) < MAX_INSTANCES
            if self.counted:
                self.instances.append(0)
        if self.counted:
            self.instances[-1] += numel_in
        pending = self.pending
        pending[0] += numel_in
        pending[1] += numel_out
        pending[2] += 1
        if pending[2] == self.bucket:
            self.points.append(pending[:2])
            self.pending = [0, 0, 0]
        if len(self.points) >= 2 * MAX_POINTS:
            self.points = [[a[0] + b[0], a[1] + b[1]]
                           for a, b in zip(self.points[::2], self.points[1::2], strict=False)]
            self.bucket *= 2

    def entry(self) -> dict:
        points = self.points + ([self.pending[:2]] if self.pending[2] else [])
        return {"points": points, "calls_per_point": self.bucket, "instances": self.instances,
                "live_at_first": self.live}


class Curve:
    """A path's real calls as cumulative elements out against cumulative elements in."""
    __slots__ = ("x", "y", "ratio", "instances", "calls", "live")

    def __init__(self, profile: dict):
        self.x, self.y = [0], [0]
        for numel_in, numel_out in profile["points"]:
            self.x.append(self.x[-1] + numel_in)
            self.y.append(self.y[-1] + numel_out)
        self.ratio = self.y[-1] / self.x[-1] if self.x[-1] else 0.0
        self.instances = profile.get("instances") or []
        self.live = profile.get("live_at_first")
        # each call's input, where points are single calls (a traced call is paired with the same-numbered one)
        self.calls = [p[0] for p in profile["points"]] if profile.get("calls_per_point", 1) == 1 else []

    def out_before(self, x: float) -> float:
        """Elements out of the real calls before input element `x` (the path's ratio past its end)."""
        total = self.x[-1]
        if x >= total:
            return self.y[-1] + (x - total) * self.ratio
        i = bisect_right(self.x, x) - 1
        span = self.x[i + 1] - self.x[i]
        return self.y[i] + (self.y[i + 1] - self.y[i]) * (x - self.x[i]) / span


class Replay:
    """A traced run's sizing by the real run's profiles (`observed`: its data_dependent_sizes)."""

    def __init__(self, observed: list[dict]):
        self.curves = {(e["site"], e["op"], path): Curve(p) for e in observed
                       for path, p in (e.get("profile") or {}).items() if p.get("points")}
        self.at: dict = {}        # (site, op, path) -> [growth, real position reached, elements out made]
        self.current: dict = {}   # (site, op, path) -> [stage id, instance number, traced in]
        self.open: list = []      # instances not yet paired: (stage id, key, number, its `current`)
        self.pairs: dict = {}     # (site, op) or None (every site) -> [traced in, real in]

    def ratio(self, site: str, op: str, path: str) -> float | None:
        """The path's aggregate ratio in the real run, or None where it never ran the site."""
        curve = self.curves.get((site, op, path))
        return curve.ratio if curve is not None else None

    def size(self, site: str, op: str, numel: int, path: str, stages: list[dict],
             live: int | None = None) -> int | None:
        """Elements out for a call of `numel` elements in at `site` in stage `path` (innermost
        stage last in `stages`), or None where no replay applies (no real calls there, no growth
        known yet)."""
        self._pair_ended({s["id"] for s in stages})
        key = (site, op, path)
        self._count_instance(key, stages[-1]["id"] if stages else None, numel)
        curve = self.curves.get(key)
        if curve is None or numel == 0:  # an empty input makes nothing and says nothing of growth
            return None
        at = self.at.get(key)
        if at is None:
            at = self.at[key] = [self._growth(site, op, curve, numel, live), 0.0, 0.0]
        growth, start, made = at
        if growth is None:
            return None
        at[1] = start + numel / growth
        at[2] = made + growth * (curve.out_before(at[1]) - curve.out_before(start))
        return min(numel, max(0, round(at[2]) - round(made)))

    def _count_instance(self, key: tuple, stage_id, numel: int) -> None:
        current = self.current.get(key)
        if current is None or current[0] != stage_id:
            number = current[1] + 1 if current is not None else 0
            current = self.current[key] = [stage_id, number, 0]
            self.open.append((stage_id, key, number, current))
        current[2] += numel

    def _pair_ended(self, open_ids: set) -> None:
        """Fold every instance whose stage has ended into the growth, against the real run's
        instance of the same path and order."""
        still = []
        for stage_id, key, number, current in self.open:
            if stage_id is not None and stage_id not in open_ids:
                curve = self.curves.get(key)
                real = curve.instances[number] if curve is not None and number < len(curve.instances) else 0
                if real:
                    for scope in (key[:2], None):
                        pair = self.pairs.setdefault(scope, [0, 0])
                        pair[0] += current[2]
                        pair[1] += real
            else:
                still.append((stage_id, key, number, current))
        self.open = still

    def _growth(self, site: str, op: str, curve: Curve, numel: int, live: int | None) -> float | None:
        """A path's growth, fixed at its first call: the smallest of every site's growth in ended
        instances, the site's own there, this call's input over the real path's first call's
        (unless they are equal: a fixed-size chunk says nothing of growth) and the live tensors'
        bytes now over the real run's at that call (see the module's docstring)."""
        first = curve.calls[0] if curve.calls else 0
        found = [g for g in (_quotient(self.pairs.get(None)), _quotient(self.pairs.get((site, op))),
                             numel / first if first and first != numel else None,
                             live / curve.live if live and curve.live else None) if g is not None]
        return min(found) if found else None


def _quotient(pair: list | None) -> float | None:
    return pair[0] / pair[1] if pair and pair[0] and pair[1] else None
