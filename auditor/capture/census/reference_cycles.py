"""Reference cycles: is a tensor's storage alive only through an unreachable reference cycle?

A buffer left in a closure cycle after a function returns (`def g(): return buf` and
`g.self = g`) outlives the call until the cycle collector next runs, maybe never (a job that
disabled it). `check` decides, for a few candidate storages, whether that is all that keeps
them, without collecting, freeing or finalizing anything:

1. the Python tensors on each storage (from the census's survey of every live tensor);
2. whether C++ holds the storage or one of those tensors beyond what the tensors themselves
   account for (an autograd graph saving it, a view's base with no Python object, a storage
   object someone keeps): held from outside, so not a cycle;
3. the upward closure of referrers: `gc.get_referrers` on the whole frontier at once, level
   by level, following only what still reaches an undecided storage, within MAX_LEVELS
   levels, MAX_EXPLORED objects explored and MAX_OBJECTS objects;
4. the collector's own test restricted to that set: an object whose referrers are all in the
   set and whose reference count exceeds the references from inside the set is held from
   outside (an executing frame's local, a module's globals through `sys.modules`, C++);
   whatever such an object reaches is alive; a storage whose tensors nothing alive reaches
   is kept only by the cycle.

Verdicts: CYCLE (proved), HELD (proved held from outside the set), UNKNOWN (the bounds
were hit before either was proved: said so, never guessed). The check can miss a cycle
(a C++ holder that is itself only reachable from the cycle counts as outside), never invent
one. It holds the collector off while it runs (its own allocations could otherwise start
the very collection it must not cause) and keeps no reference once it returns.

Another thread changing references while the check runs can mislead it; the audit calls it
at the end of top-level stages.

Cost, measured (CPython 3.11, this project's 2-core CPU machine, on a heap of 1.17M tracked
objects where the census itself takes 0.11-0.15 s): no candidate, nothing; a 16 MiB tensor
held by a local, 0.023 s (one level); the same in a closure cycle, 0.12 s (5 levels); a
chain deeper than the bounds, 0.29 s (12 levels). Each level is one `gc.get_referrers` scan
of the heap (~0.023 s there) plus ~2 ms per object of its frontier, so the worst case is
about MAX_LEVELS scans and MAX_EXPLORED frontier objects: ~1.3 s on that heap.
"""
from __future__ import annotations

import gc
import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable

import torch

CYCLE = "cycle"
HELD = "held"
UNKNOWN = "unknown"
MAX_LEVELS = 12       # rounds of gc.get_referrers (each scans every tracked object) ...
MAX_EXPLORED = 512    # ... for all the objects of its frontier: objects explored in all
MAX_OBJECTS = 20_000  # objects in the upward closure

KeysOf = Callable[[torch.Tensor], Iterable[Hashable]]


def check(candidates: list, keys_of: KeysOf, tensors: list) -> dict:
    """Verdicts for the storages keyed `candidates` (`keys_of(tensor)`: the keys of the
    storages a tensor is on). `tensors`: every live tensor; the check takes this list over
    and empties it, so the caller must hold no other reference to any tensor.

    Returns {"verdicts": {key: CYCLE | HELD | UNKNOWN}, "candidates", "cycles", "held",
    "unknown", "objects", "levels", "bounded" (a bound was hit), "seconds"}."""
    started = time.perf_counter()
    verdicts = dict.fromkeys(candidates, UNKNOWN)
    closure = _Closure()
    collecting = gc.isenabled()
    gc.disable()
    try:
        groups = closure.add_tensors_on(set(verdicts), keys_of, tensors)
        _decide(closure, verdicts, groups)
    finally:
        tensors.clear()
        closure.release()
        if collecting:
            gc.enable()
    counts = Counter(verdicts.values())
    return {"verdicts": verdicts, "candidates": len(verdicts), "cycles": counts[CYCLE],
            "held": counts[HELD], "unknown": counts[UNKNOWN], "objects": closure.size,
            "levels": closure.levels, "bounded": closure.bounded,
            "seconds": round(time.perf_counter() - started, 6)}


def _decide(closure: _Closure, verdicts: dict, groups: dict) -> None:
    open_groups = {}
    for key, positions in groups.items():
        if closure.held_from_cpp(positions):
            verdicts[key] = HELD
        else:
            open_groups[key] = positions
    while open_groups:
        held, unknown, parents = closure.reached()
        for key, positions in list(open_groups.items()):
            if any(p in held for p in positions):
                verdicts[key] = HELD
            elif not any(p in unknown for p in positions):
                verdicts[key] = CYCLE
            else:
                continue
            del open_groups[key]
        # explore only what still reaches an undecided storage
        relevant = _reach([p for positions in open_groups.values() for p in positions], parents, set())
        if open_groups and not closure.expand(relevant):
            break  # bounds hit: the rest stay UNKNOWN


class _Closure:
    """The objects that reach the candidates' tensors, each held once, in `nodes`: the
    check's only reference to each (its refcount reading subtracts exactly this one)."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.index: dict[int, int] = {}  # id -> position in nodes
        self.unexplored: set[int] = set()  # positions whose referrers are not all in nodes
        self.explored = 0
        self.levels = 0
        self.bounded = False
        self.size = 0

    def add_tensors_on(self, wanted: set, keys_of: KeysOf, tensors: list) -> dict:
        """Position lists of the Python tensors on each wanted storage; empties `tensors`."""
        groups: dict = {}
        if not wanted:
            return groups
        try:
            for obj in tensors:
                try:
                    keys = [key for key in keys_of(obj) if key in wanted]
                except Exception:  # metadata that cannot be read: not one of ours
                    continue
                if keys:
                    position = self._add(obj)
                    for key in keys:
                        groups.setdefault(key, []).append(position)
        finally:
            tensors.clear()
            obj = None  # noqa: F841  (the loop variable's reference)
        return groups

    def _add(self, obj) -> int:
        position = self.index.get(id(obj))
        if position is None:
            position = self.index[id(obj)] = len(self.nodes)
            self.nodes.append(obj)
            self.unexplored.add(position)
            self.size = len(self.nodes)
        return position

    def held_from_cpp(self, positions: list[int]) -> bool:
        """True when something outside Python's objects holds the storage or one of its
        tensors: a tensor's implementation used by more than its Python object and its views,
        the storage by more than these tensors and the one storage object looked at here."""
        group = [self.nodes[p] for p in positions]
        try:
            if any(t.layout is not torch.strided for t in group):
                return True  # sparse: its parts' holders are not followed here
            ids = {id(t) for t in group}
            views: Counter[int] = Counter()
            for t in group:
                if t._is_view():
                    base_id = id(t._base)
                    if base_id not in ids:  # a base with no Python object here: held by C++
                        return True
                    views[base_id] += 1
            if any(t._use_count() != 1 + views[id(t)] for t in group):
                return True
            return _storage_uses(group[0]) != (len(group) + 1, _FRESH_STORAGE_REFS)
        except Exception:  # an exotic tensor whose holders cannot be read: not proved free
            return True
        finally:
            group.clear()

    def expand(self, relevant: set[int]) -> bool:
        """Add the referrers of the unexplored objects among `relevant` (one scan of the
        heap, whose cost grows with the frontier); False when a bound stops it or nothing
        relevant is left to explore."""
        positions = sorted(self.unexplored & relevant)
        if not positions:
            return False
        if self.levels >= MAX_LEVELS or self.explored + len(positions) > MAX_EXPLORED:
            self.bounded = True
            return False
        frontier = [self.nodes[p] for p in positions]
        found = gc.get_referrers(*frontier)
        self.levels += 1
        try:
            for obj in found:
                if obj is frontier or obj is self.nodes or id(obj) in self.index:
                    continue
                if len(self.nodes) >= MAX_OBJECTS:  # the frontier keeps referrers not in the set
                    self.bounded = True
                    return False
                self._add(obj)
            obj = None  # noqa: F841
            self.unexplored.difference_update(positions)
            self.explored += len(positions)
            return True
        finally:
            found.clear()
            frontier.clear()

    def reached(self) -> tuple[set[int], set[int], list[list[int]]]:
        """Positions reached from an object held from outside the set; (of the rest)
        positions reached from an unexplored object, whose referrers are not all known; and
        each position's referrers in the set."""
        count = len(self.nodes)
        inside = [0] * count
        children: list[list[int]] = [[] for _ in range(count)]
        parents: list[list[int]] = [[] for _ in range(count)]
        referents: list[object] | None
        for i in range(count):
            referents = gc.get_referents(self.nodes[i])
            for referent in referents:
                j = self.index.get(id(referent))
                if j is not None:
                    inside[j] += 1
                    children[i].append(j)
                    parents[j].append(i)
            referents.clear()
        referent = referents = None  # noqa: F841
        outside = [i for i in range(count) if i not in self.unexplored
                   and sys.getrefcount(self.nodes[i]) - _OWN_REFS > inside[i]]
        held = _reach(outside, children, set())
        unknown = _reach(self.unexplored, children, held)
        return held, unknown, parents

    def release(self) -> None:
        self.nodes.clear()
        self.index.clear()


def _reach(starts: Iterable[int], edges: list[list[int]], excluded: set[int]) -> set[int]:
    seen: set[int] = set()
    stack = [s for s in starts if s not in excluded]
    while stack:
        i = stack.pop()
        if i in seen or i in excluded:
            continue
        seen.add(i)
        stack.extend(edges[i])
    return seen


def _storage_uses(t: torch.Tensor) -> tuple[int, int]:
    """(C++ use count, Python reference count) of `t`'s storage while one storage object is
    held here."""
    storage = t.untyped_storage()
    return torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(storage)


# sys.getrefcount(self.nodes[i]) counts the nodes list's reference and its own argument's
_OWN_REFS = 2
# what _storage_uses reads for a storage object nobody else holds (measured: it differs
# between torch versions)
_FRESH_STORAGE_REFS = _storage_uses(torch.empty(1))[1]
