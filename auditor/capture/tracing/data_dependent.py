"""Data-dependent sizes: outputs whose size depends on tensor values, observed in a real run
and estimated in a traced one.

    with auditor.Audit(out="runs/small", record_sizes=True) as run:       # real, small model
        prune(model)
    sizes = run.record["data_dependent_sizes"]
    with auditor.Audit(out="runs/7b", traced=True, observed_sizes=sizes):  # fake, 7B model
        prune(build_7b())

`nonzero`, `masked_select`, boolean indexing, `unique` and `bincount` make outputs sized by values, and a
count read back into Python (`int(torch.count_nonzero(mask))`, `mask.sum().item()`) sizes
whatever the program allocates with it. Fake tensors have no values, so a traced run alone
can only make these empty. The real run at the audited scale knows each size: per call site
(the program's innermost frame, `auditor.facts.allocation_sites`) and operator it records how many
elements came out per element that went in (`SizeRecorder`), and the traced run sizes each
output at the same site as that ratio times its own input (`SizeEstimates`).

The ratio kept is the aggregate, total output over total input across the site's calls: it
is what makes the traced run's total bytes right when the target makes the same kind of calls
on more elements (the largest ratio would size every chunk of a mask as its densest one; the
last is whichever chunk came last). The smallest and largest are kept beside it. A site's calls
are not equally dense, though, and a stage's peak rests on the call it was making: so each
site also keeps its calls in order per stage path (`profile`), and the traced run sizes a call
by the real calls at the same relative position, which keeps each path's aggregate
(auditor.capture.tracing.size_profiles); the aggregate alone where that cannot be placed.

Where no real run observed a site, a ratio the program declares is used instead:

    with auditor.expect_fraction(0.1):      # about a tenth of the weights become candidates
        candidates = weights[scores < threshold]

(a no-op outside traced runs). Otherwise the output is empty and the site is listed as
unknown: a traced record says which of its sizes rest on what, never silently.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

from auditor.capture.tracing.dispatch_mode import MeasuringMode
from auditor.capture.tracing.expected_fraction import declared_fraction, expect_fraction  # noqa: F401
from auditor.capture.tracing.size_profiles import Profile, Replay
from auditor.facts.allocation_sites import caller_site

aten = torch.ops.aten

OBSERVED, DECLARED, UNKNOWN = "observed", "declared", "unknown"
NO_SITE = "(no frame of the program)"
# Operators whose output size depends on values, and the counts a program reads back.
UNIQUE = (aten._unique2.default, aten.unique_consecutive.default)
SIZED_BY_VALUES = (aten.nonzero.default, aten.masked_select.default, aten.index.Tensor,
                   aten.bincount.default, *UNIQUE)
COUNTING = (aten.count_nonzero.default, aten.sum.default)
READ_BACK = aten._local_scalar_dense.default
WATCHED = frozenset((*SIZED_BY_VALUES, *COUNTING, READ_BACK))

def op_name(func) -> str:
    return func._schema.name


def open_stages() -> list[dict]:
    """The audit's stages open on this thread, outermost first ([] outside an audit)."""
    from auditor.capture.stage import active_audit
    audit = active_audit()
    return audit.open_stages() if audit is not None else []


def live_bytes() -> int | None:
    """The audit's live-tensor bytes now (None without an audit or its meter)."""
    from auditor.capture.stage import active_audit
    audit = active_audit()
    return audit.live_tensor_bytes() if audit is not None else None


def stage_path(stages: Sequence[dict]) -> str:
    """The innermost stage's path without call numbers (`f#3/g#2` -> `f/g`): a staged callable's
    calls are one path, in order, however many a larger model makes."""
    return _CALL_NUMBER.sub("", stages[-1]["path"]) if stages else ""


_CALL_NUMBER = re.compile(r"#\d+(?=/|$)")


def selection(func, args, kwargs) -> tuple[torch.Tensor, int, int] | None:
    """(the mask or input the size is taken from, its element count, the output dim sized by
    it) for a value-sized call this module can estimate; None for any other form."""
    if func is aten.index.Tensor:
        indices = args[1]
        given = [i for i in indices if i is not None]
        if len(given) != 1 or given[0].dtype not in (torch.bool, torch.uint8):
            return None
        return given[0], given[0].numel(), _position(indices)
    source = args[0]
    if func is aten.masked_select.default:
        return args[1], torch.broadcast_shapes(source.shape, args[1].shape).numel(), 0
    return source, source.numel(), 0


def _position(indices) -> int:
    """How many leading dims are left whole (None) before the one boolean index."""
    return next(i for i, index in enumerate(indices) if index is not None)


def counts_elements(func, args) -> bool:
    """A whole-tensor count a program may read back: count_nonzero, or sum over a bool tensor."""
    return func is aten.count_nonzero.default or (args[0].dtype is torch.bool and len(args) == 1)


class SiteSizes:
    """One site's calls of one operator: elements in and out, summed; smallest and largest ratio;
    the calls in order per stage path (auditor.capture.tracing.size_profiles)."""
    __slots__ = ("calls", "input_numel", "output_numel", "largest", "low", "high", "profiles")

    def __init__(self) -> None:
        self.calls = self.input_numel = self.output_numel = self.largest = 0
        self.low, self.high = math.inf, 0.0
        self.profiles: dict[str, Profile] = {}

    def add(self, numel_in: int, numel_out: int, stages: Sequence[dict] = (), live: int | None = None) -> None:
        path = stage_path(stages)
        profile = self.profiles.get(path)
        if profile is None:
            profile = self.profiles[path] = Profile(live)
        profile.add(stages[-1]["id"] if stages else None, numel_in, numel_out)
        self.calls += 1
        self.input_numel += numel_in
        self.output_numel += numel_out
        self.largest = max(self.largest, numel_out)
        if numel_in:
            ratio = numel_out / numel_in
            self.low, self.high = min(self.low, ratio), max(self.high, ratio)

    def entry(self, site: str, op: str) -> dict:
        ratio = self.output_numel / self.input_numel if self.input_numel else 0.0
        return {"site": site, "op": op, "calls": self.calls, "input_numel": self.input_numel,
                "output_numel": self.output_numel, "largest_output": self.largest, "ratio": ratio,
                "min_ratio": self.low if self.calls and self.low != math.inf else None,
                "max_ratio": self.high if self.calls else None,
                "profile": {path: p.entry() for path, p in self.profiles.items()}}


class SizeRecorder(MeasuringMode):
    """A real run's data-dependent sizes, per (site, operator). Does work for `WATCHED` only:
    one set lookup for every other operator."""

    observes_only = True

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[tuple[str, str], SiteSizes] = {}
        self._counts = WeakIdKeyDictionary()  # a count's scalar -> (site, op, elements counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in WATCHED:
            self._note(func, args, out)
        return out

    def _note(self, func, args, out) -> None:
        if func is READ_BACK:
            counted = self._counts.get(args[0])
            if counted is not None:
                site, op, numel, stages, live = counted
                self._site(site, op).add(numel, int(out), stages, live)
        elif func in COUNTING:
            if counts_elements(func, args) and out.dim() == 0:
                self._counts[out] = (caller_site() or NO_SITE, op_name(func), args[0].numel(),
                                     open_stages(), live_bytes())
        else:
            sized = selection(func, args, {})
            if sized is not None:
                _, numel, dim = sized
                made = (out.numel() if func is aten.bincount.default else
                        out[0].numel() if func in UNIQUE else out.shape[dim])
                self._site(caller_site() or NO_SITE, op_name(func)).add(numel, made, open_stages(), live_bytes())

    def _site(self, site: str, op: str) -> SiteSizes:
        sizes = self.sites.get((site, op))
        if sizes is None:
            sizes = self.sites[site, op] = SiteSizes()
        return sizes

    def entries(self) -> list[dict]:
        """The record's `data_dependent_sizes`, largest output first."""
        found = [sizes.entry(site, op) for (site, op), sizes in self.sites.items()]
        return sorted(found, key=lambda e: -e["output_numel"])


class SizeEstimates:
    """A traced run's sizing of data-dependent outputs: the real run's calls at the same site and
    relative position (auditor.capture.tracing.size_profiles), else the real run's ratio at the same site and
    stage path, else at the same site, else the declared fraction, else empty (unknown).
    `estimate=False`: every such size empty (the lower bound a traced figure's estimated part
    is measured against).

    One mask read twice gets one count (its tensor, or an equal view of its storage), so a count
    read back and the selection it sizes agree, as they do in a real run; `unique` keeps counts
    of its own (how many distinct values, not how many are true)."""

    def __init__(self, observed: list[dict] | None = None, estimate: bool = True):
        self.observed = {(e["site"], e["op"]): e for e in observed or ()}
        self.estimate = estimate
        self.replay = Replay(observed or [] if estimate else [])
        self.sites: dict[tuple[str, str], dict] = {}
        self._by_tensor = WeakIdKeyDictionary()   # mask -> count
        self._by_storage = WeakIdKeyDictionary()  # mask's storage -> {(offset, shape, stride): count}

    def count(self, func, mask: torch.Tensor, numel: int) -> int:
        """Elements out of a value-sized call of `func` on `numel` elements (`mask` decides)."""
        site, op = caller_site() or NO_SITE, op_name(func)
        entry = self._entry(site, op)
        kind = "unique" if func in UNIQUE else "true"
        stages = open_stages()
        replayed = (self.replay.size(site, op, numel, stage_path(stages), stages, live_bytes())  # moves on
                    if entry["source"] == OBSERVED else None)
        known = self._remembered(mask, kind)
        if known is None:
            if replayed is not None:
                known = replayed
                entry["replayed_calls"] += 1
            else:
                ratio = self._placed_ratio(entry, stage_path(stages))
                known = 0 if ratio is None else min(numel, max(0, round(ratio * numel)))
            self._remember(mask, kind, known)
        return self._made(entry, numel, known)

    def _placed_ratio(self, entry: dict, path: str) -> float | None:
        """The real run's ratio at the site in this stage path where it ran there, else the site's."""
        if entry["source"] == OBSERVED:
            in_path = self.replay.ratio(entry["site"], entry["op"], path)
            if in_path is not None:
                return in_path
        return entry["ratio"]

    def bins(self, func, values: torch.Tensor, minlength: int) -> int:
        """bincount's length: it follows the largest value, not the input's size, so the
        largest length the real run saw at the site (at least `minlength`)."""
        entry = self._entry(caller_site() or NO_SITE, op_name(func))
        seen = (self.observed.get((entry["site"], entry["op"])) or {}).get("largest_output", 0)
        return self._made(entry, values.numel(), max(minlength, seen if self.estimate else 0))

    @staticmethod
    def _made(entry: dict, numel: int, made: int) -> int:
        entry["calls"] += 1
        entry["input_numel"] += numel
        entry["output_numel"] += made
        return made

    def conflict(self, site: str, op: str) -> None:
        """An estimated size met a size the program computed otherwise (see tracing)."""
        key = (site, op)
        self.sites.setdefault(key, {"site": site, "op": op, "calls": 0, "input_numel": 0,
                                    "output_numel": 0, "ratio": None, "source": None, "conflicts": 0,
                                    "replayed_calls": 0})
        self.sites[key]["conflicts"] += 1

    def _entry(self, site: str, op: str) -> dict:
        entry = self.sites.get((site, op))
        if entry is None or entry["source"] is None:
            ratio, source = self._ratio(site, op)
            base = {"site": site, "op": op, "calls": 0, "input_numel": 0, "output_numel": 0,
                    "conflicts": 0, "replayed_calls": 0} if entry is None else entry
            base.update(ratio=ratio, source=source)
            entry = self.sites[site, op] = base
        return entry

    def _ratio(self, site: str, op: str) -> tuple[float | None, str]:
        if not self.estimate:
            return None, UNKNOWN
        if (site, op) in self.observed:
            return self.observed[site, op]["ratio"], OBSERVED
        declared = declared_fraction()
        if declared is not None:
            return declared, DECLARED
        return None, UNKNOWN

    def _remembered(self, mask: torch.Tensor, kind: str) -> int | None:
        known = (self._by_tensor.get(mask) or {}).get(kind)
        if known is None:
            views = self._views(mask)
            known = views.get((kind, *_geometry(mask))) if views is not None else None
        return known

    def _remember(self, mask: torch.Tensor, kind: str, count: int) -> None:
        self._by_tensor.setdefault(mask, {})[kind] = count
        try:
            storage = mask.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        self._by_storage.setdefault(storage, {})[(kind, *_geometry(mask))] = count

    def _views(self, mask: torch.Tensor) -> dict | None:
        try:
            return self._by_storage.get(mask.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return None

    def entries(self) -> list[dict]:
        """Every data-dependent site the traced run met, with its ratio and where it came from."""
        return sorted(self.sites.values(), key=lambda e: -e["output_numel"])


def _geometry(t: torch.Tensor) -> tuple:
    return t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype
