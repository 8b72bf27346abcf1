"""The census roots of one audit, and the censuses it takes with them.

A census (auditor.capture.census.take) names live tensor storages by the roots that hold them,
in their order of priority: those the program tracked (`auditor.track`), then the modules and
optimizers found alive (auditor.capture.census.discovered_roots), then the receivers of staged
methods (and the live objects of their classes no call met yet) and the program's objects
held by the frames inside the open stages.

Censuses run at stage ends, at the run's end when unstaged intervals wait for owners, and,
with the live-tensor meter, inside stages near its highs (auditor.capture.census.census_at_highs).
Each one's time and transient memory are kept out of the stages; a census that fails is
switched off with a warning, the stages go on without components.
"""
from __future__ import annotations

import importlib
import sys
import threading
import time
import weakref
from collections.abc import Callable, Set
from typing import TYPE_CHECKING, Any

from auditor.capture.probe_set import ProbeSet
from auditor.capture.stage import AUDITOR_CODE, in_auditor_code
from auditor.capture.stage_book import Clock, OpenStage, StageBook
from auditor.capture.staging.targets import Staging
from auditor.record.schema import Component, TensorTotals, written_as

if TYPE_CHECKING:  # imports torch: loaded only once a census is asked for
    from auditor.capture.census.census_at_highs import CensusAtHighs
    from auditor.capture.census.take import Root

MAX_INSTANCE_ROOTS = 4096  # objects of staged classes made roots without a call of theirs

Reference = Callable[[], object]  # a weak reference, or a strong one for an object without weak references
# components, tensors, owners (see CensusRoots.census)
Census = tuple[dict[str, Component] | None, TensorTotals | None, dict | None]
COMPONENT_KEYS = ("category", "bytes", "tensors")  # a component's keys as written; then, with copies:
COPY_KEYS = ("copy_bytes", "weights_copied", "parameters_copied")


class CensusRoots:
    """Roots registered by name (tracked, receivers, found), and the census taken over them.
    `take_census` is None while the census is off (or after it failed)."""

    def __init__(self, probes: ProbeSet, book: StageBook, clock: Clock, lock: threading.RLock,
                 staging: Staging, warn: Callable[[str], None], fault: Callable[[str, Exception], None],
                 instance_label: Callable[[object], tuple[bool, str | None]]):
        self._probes, self._book, self._clock, self._lock = probes, book, clock, lock
        self._staging, self._warn, self._fault = staging, warn, fault
        self._instance_label = instance_label  # a staged class's object -> (ready, label), the call labels'
        self.take_census: Callable[..., dict] | None = None
        self._root: type[Root] | None = None
        self._roots: dict[str, tuple[Reference, dict[str, str] | None]] = {}
        self._instances_named = 0  # roots the census found as objects of a staged class
        self._found_roots: set[str] = set()  # their names, until a call of theirs names them
        self._receivers: set[str] = set()  # roots the audit registered itself (after the tracked)
        self._highs: CensusAtHighs | None = None  # censuses near live-tensor highs inside stages

    def start(self, pending: list[str]) -> dict:
        """Load the census when it is on, and its censuses at highs with the live-tensor meter
        (after the meters, before the recorders). Returns the census probe's state."""
        state = {"state": "off"}
        if self._probes.options["census"]:
            state = self._load(pending)
        if self.take_census is not None and self._probes.live is not None:
            try:
                from auditor.capture.census.census_at_highs import CensusAtHighs
                self._highs = CensusAtHighs(self._probes.live_tensor_bytes, self._probes.live_tensor_high,
                                            self._in_program_stage, self._census_at_high)
            except Exception as error:  # stage-end censuses still run
                pending.append(f"no census inside stages (torch's global hooks: "
                               f"{type(error).__name__}: {error})")
        return state

    def _load(self, pending: list[str]) -> dict:
        try:
            census = importlib.import_module("auditor.capture.census.take")
            self.take_census, self._root = census.take_census, census.Root
        except (ImportError, AttributeError) as error:
            reason = f"auditor.capture.census.take is unavailable ({error})"
            pending.append(f"census absent: {reason}")
            return {"state": "absent", "reason": reason}
        return {"state": "on"}

    def close_highs(self) -> None:
        if self._highs is not None:
            self._probes.states.setdefault("census", {})["census_at_highs"] = self._highs.taken
            self._highs.close()
            self._highs = None

    # -- roots ---------------------------------------------------------------------------

    def track(self, name: str, obj: object, categories: dict[str, str] | None = None) -> None:
        if self.take_census is None:
            return  # census off: holding a reference would only keep memory alive
        with self._lock:
            self._roots[name] = (_reference(obj), categories)

    def track_receiver(self, obj: object, label: str | None = None, found: bool = False) -> str | None:
        """Register a staged method's `self` under its class name and its call's label
        (`SparseGPT[model.layers.3.mlp.down_proj]`), else `SparseGPT`, `SparseGPT#2`; once per
        object. Returns the root's name. `found`: met by the census, not in a call; its first
        call's label (a user hook's) renames it if it differs."""
        if self.take_census is None:
            return None
        with self._lock:
            base = type(obj).__name__ if label is None else f"{type(obj).__name__}[{label}]"
            for name, (ref, _) in list(self._roots.items()):
                if ref() is obj:
                    if found or name not in self._found_roots:
                        return name
                    self._found_roots.discard(name)
                    if name == base or name.startswith(base + "#"):
                        return name
                    del self._roots[name]  # named by the default rule; the call names it now
                    break
            name, count = base, 1
            while name in self._roots and self._roots[name][0]() is not None:
                count += 1
                name = f"{base}#{count}"
            self._roots[name] = (_reference(obj), None)
            self._receivers.add(name)
            if found:
                self._found_roots.add(name)
            return name

    def _name_instance(self, obj: object) -> str | None:
        """A live object of a staged method's class that no call has met yet: a root named
        as its calls would name it (the census asks, auditor.capture.census.take.take_census)."""
        if self._instances_named >= MAX_INSTANCE_ROOTS:
            return None
        ready, label = self._instance_label(obj)
        if not ready:
            return None
        self._instances_named += 1
        return self.track_receiver(obj, label, found=True)

    def _tracked_roots(self, leave_out: Set[str] = frozenset()) -> dict[str, Root]:
        assert self._root is not None  # loaded with take_census
        roots = {}
        for name, (ref, categories) in list(self._roots.items()):
            obj = ref()
            if obj is not None and name not in leave_out:
                roots[name] = self._root(obj=obj, categories=categories)
        return roots

    def _census_roots(self, closing: OpenStage | None) -> dict[str, Root]:
        """The roots in their order of priority: those the program tracked, then the modules and
        optimizers found alive (auditor.capture.census.discovered_roots), then the receivers of staged methods
        and the program's objects held by the frames inside the open stages."""
        from auditor.capture.census import discovered_roots  # imports torch: only once a census runs
        assert self._root is not None  # loaded with take_census
        stack = self._book.thread_stack()
        outermost = stack[0] if stack else closing
        last = outermost.frame if outermost is not None else None
        caller = sys._getframe(1)  # never this frame itself: a frame in its own locals is a cycle
        try:
            taken = {name: ref() for name, (ref, _) in list(self._roots.items())}
            found, instances = discovered_roots.found_roots(
                {name: obj for name, obj in taken.items() if obj is not None},
                discovered_roots.program_frames(caller),
                discovered_roots.frames_until(caller, last) if last is not None else [])
            taken.clear()
        finally:  # the frames (and all they hold) must not outlive this census
            del caller, last, outermost
        for obj in instances:
            self.track_receiver(obj, None, found=True)
        del instances
        given = self._tracked_roots()
        roots = {name: root for name, root in given.items() if name not in self._receivers}
        for name, obj in found:
            roots[name] = self._root(obj=weakref.ref(obj))
        found.clear()
        roots.update((name, root) for name, root in given.items() if name in self._receivers)
        return roots

    # -- censuses ------------------------------------------------------------------------

    def census(self, closing: OpenStage | None = None) -> Census:
        """Tensor census at a stage end (`closing`'s) or inside stages; its time and transient
        memory are kept out of stages. Returns components, tensors, and {"owners",
        "components"} when the live-tensor meter needs owners and the census gives them (also
        resolving unstaged intervals' owners)."""
        began = time.perf_counter()
        try:
            roots = self._census_roots(closing)
        except Exception as error:  # roots found are a help: never the census's failure
            self._warn(f"census roots could not be found, only the tracked ones count: "
                       f"{type(error).__name__}: {error}")
            roots = self._tracked_roots(self._receivers)
        probes = self._probes
        live = probes.live  # the meter matches its storages to their owners
        # reference cycles: checked at top-level stage ends and the run's end (auditor.capture.census.reference_cycles)
        extra: dict[str, Any] = {"find_cycles": True} if not self._book.thread_stack() else {}
        census = None
        classes = self._staging.receiver_classes()
        if classes:  # every object of a staged method's class, called yet or not, is a root
            extra.update(instances_of=classes, name_instance=self._name_instance)
        take_census = self.take_census
        assert take_census is not None  # asked for only while the census is on
        try:
            if live is not None:  # unowned storages are named by the line that allocated them
                extra["sites"] = live.sites()
                result = take_census(roots, count_fake=probes.options["traced"], with_owners=True, **extra)
                census = {"owners": result["owners"], "components": result["components"]}
            else:
                result = take_census(roots, count_fake=probes.options["traced"], **extra)
            components = {owner: _component(found) for owner, found in result["components"].items()}
            tensors = written_as(TensorTotals(live_bytes=result["live_tensor_bytes"]), ("live_bytes",))
            if "cycle_check" in result:  # what was checked, found, left unknown (after live_bytes)
                tensors.cycle_check = result["cycle_check"]
        except Exception as error:
            self._warn(f"census failed, switched off: {type(error).__name__}: {error}")
            self.take_census = None
            components, tensors = None, None
        probes.resolve_owners(census)
        probes.reset()  # the census's own allocations belong to no stage
        self._clock.keep_out(began, "census_s")
        return components, tensors, census

    def _in_program_stage(self) -> bool:
        """The program (not the auditor) runs inside a stage on this thread."""
        return not in_auditor_code() and bool(self._book.thread_stack())

    def _census_at_high(self) -> None:
        """A census inside a stage (auditor.capture.census.census_at_highs): the peaks so far are folded into
        the open stages first, so its own memory counts in none; it names the live storages."""
        with AUDITOR_CODE:
            try:
                with self._lock:
                    self._probes.read()
                    self.census()
            except Exception as error:
                self._fault("taking a census near a live-tensor high", error)


def _reference(obj: object) -> Reference:
    """A weak reference where the object allows one, else a strong one (documented)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _component(found: dict) -> Component:
    """A census's component as the record's (auditor.capture.census.take writes it as a dict)."""
    copies = "copy_bytes" in found
    component = Component(category=found["category"], bytes=found["bytes"], tensors=found["tensors"],
                          copy_bytes=found.get("copy_bytes"), weights_copied=found.get("weights_copied"),
                          parameters_copied=found.get("parameters_copied"))
    return written_as(component, COMPONENT_KEYS + COPY_KEYS if copies else COMPONENT_KEYS)
