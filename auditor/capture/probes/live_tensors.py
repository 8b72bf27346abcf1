"""Live tensor bytes and their true peak, counted storage by storage as torch creates and frees them.

RSS and live tensors are different quantities: RSS also holds the interpreter, libraries and
memory the allocator keeps after a free. This probe counts only tensor storages, exactly,
including the ones autograd saves for backward (which no Python object references, so a
census of Python objects cannot see them). It is a `TorchDispatchMode`: every operator's
outputs pass through it, each new storage is counted once and uncounted by a finalizer when
it dies. It works the same on real and fake tensors, which is what lets a traced run of a 7B
model on this machine be compared byte for byte with a real run of a small one.

Tensors created before the meter starts are seeded from a scan of live objects. A storage resized
in place (`UntypedStorage.resize_`, which no operator dispatches: FSDP2 frees a layer's gathered
weights by resizing their storage to 0 and gathers them again into the same storage) counts at
its new size from then on, as if the old one were freed and a new one made.

What was alive at the peak (`at_peak`): each live storage has a row in a table (its size, the
stage it was created in, the operator that created it, its census key), under an integer
serial in creation order; no tensor is referenced. The set alive at the interval's high-water
moment is exact and never copied while the program runs: it is every storage created up to
the one that made the high (serial <= `_peak_serial`) and not freed since, plus those freed
since the high, which a release moves to a side list (cleared at each new high, so it never
holds more rows than were alive at the high). Cost: O(1) per storage created or freed, and
one pass over the live table when an interval's composition is read (at stage boundaries).
Each census with owners also marks the live rows with their component, so a storage freed
before a stage ends (a Hessian freed by the method that used it) is still named at its peak.

Provenance (auditor.capture.census.provenance): each storage's cell also says what it is: a parameter's (the
storages of every `nn.Parameter` alive when the meter starts, registered in a module since, or
met as an operator's first argument), a module buffer's, or a copy of the weights (made by a
copying operator from a parameter's storage or from such a copy), with the bytes of the weights
it holds the values of. Cost: one dictionary lookup per operator, and a look at the inputs of
copying operators and of operators whose first argument is a parameter; the census reads the
copies alive (`provenance`) in one pass over the cells.
"""
from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from auditor.capture.census import provenance
from auditor.capture.census.ownership import ACTIVATIONS, BUFFERS, MASKS, OTHER, SAVED_COPIES
from auditor.capture.census.provenance import BUFFER, COPY, PARAMETER
from auditor.capture.census.take import ALLOCATED_AT, is_fake, storage_key
from auditor.capture.stage import AUDITOR_CODE
from auditor.capture.tracing.dispatch_mode import MeasuringMode
from auditor.facts import allocator_retention
from auditor.facts.allocation_sites import MIN_BYTES as SITE_MIN_BYTES
from auditor.facts.allocation_sites import allocation_site, communication_buffer
from auditor.facts.allocator_retention import MMAP_THRESHOLD_MAX
from auditor.record.schema import AtPeak, AtPeakRow, LiveTensors, written_as

NO_CENSUS = "unknown (no census)"
AT_PEAK_ROW_KEYS = ("owner", "category", "created_in", "op", "bytes", "tensors", "alive_at_end")  # as written
MAX_ROWS = 25
# A row of the live table: [serial, bytes, created_in, op, census key, is bool, the last
# component and category a census named it under while it was alive (or None, None), and the
# line of the program that asked for it (auditor.facts.allocation_sites; None below its MIN_BYTES),
# the bytes of the weights it holds a copy of (0: none), its origin (auditor.capture.census.provenance)].
SERIAL, KEY, SEEN_OWNER, SEEN_CATEGORY, SITE, COPY_OF, ORIGIN = 0, 4, 6, 7, 8, 9, 10
# A storage's cell: [serial, bytes, on heap, origin, the weights' element size (copies and
# parameters), bytes of the weights copied, the parameter storage's key, its own key (copies, buffers)]
KIND, ITEMSIZE, COVERED, SOURCE, OWN_KEY = 3, 4, 5, 6, 7
# what each operator does for provenance, looked up once per operator (auditor.capture.census.provenance)
_PLAIN, _COPIES, _COPIES_LIST, _COPIES_INTO = 0, 1, 2, 3
UNOWNED = "unowned"  # the census's component for tensors no root reaches: no name worth keeping


@dataclass
class PeakSet:
    """The storages alive at one interval's high-water moment (rows of the live table)."""
    bytes: int
    rows: list[list]


class LiveTensorMeter(MeasuringMode):
    """Counts live storage bytes; `peak` is the highest count since the last `reset_peak`.

    With `at_peak`, also keeps the live table that `peak_set()` reads. `stage_path` is set by
    the audit: the innermost stage open on the thread the meter counts (a dispatch mode sees
    that thread's operators only), recorded as each storage's `created_in`."""

    observes_only = True

    def __init__(self, at_peak: bool = True) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.at_peak = at_peak
        self.stage_path: str | None = None
        self._cells: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> its cell (KIND ...)
        self._op_kinds: dict = {}  # id(operator) -> _PLAIN, _COPIES, ... (auditor.capture.census.provenance)
        self._hooks: list = []     # the global parameter and buffer registration hooks, while counting
        # ids of parameters met as an operator's first argument and marked (an id reused by a
        # later parameter only skips this mark: hooks and copying operators still mark it)
        self._marked: set[int] = set()
        self._serial = 0
        self._table: dict[int, list] = {}    # serial -> row, creation order
        self._peak_serial = 0                # the newest storage alive at the high
        self._freed_since_peak: list[list] = []
        # at_peak's cost: passes over the table, rows they read, seconds in its boundary work
        self.peak_sets = self.rows_read = 0
        self.seconds = 0.0
        self._lock = threading.RLock()  # a finalizer can run inside our own section (GC)
        # glibc's dynamic mmap threshold, followed from the storages freed (auditor.facts.allocator_retention)
        malloc = allocator_retention.malloc_settings(os.environ)
        self._dynamic_threshold = not allocator_retention.threshold_fixed(malloc)
        self.mmap_threshold = allocator_retention.starting_threshold(malloc)
        # CPU storages below the threshold when made come from glibc's heap, which keeps the
        # space they leave: the most of them alive at once bounds what it can keep
        self.heap_live = 0
        self.heap_high_water = 0

    def seed_existing(self) -> None:
        """Count the tensors already alive (model weights built before the audit began)."""
        gc.collect()  # unreachable cycles still holding tensors are not alive: don't count them
        modules = []
        for obj in gc.get_objects():
            kind = type(obj)  # type(): some modules warn on isinstance
            if issubclass(kind, torch.Tensor):
                self._track(obj, None, None)
                if _is_parameter(obj):
                    self._mark(obj, PARAMETER)
                if obj.is_leaf and obj.grad is not None:
                    self._track(obj.grad, None, None)
            elif issubclass(kind, torch.nn.Module):
                modules.append(obj)
        for module in modules:
            for buffer in list(vars(module).get("_buffers", {}).values()):
                if isinstance(buffer, torch.Tensor):
                    self._mark(buffer, BUFFER)

    def reset_peak(self) -> int:
        """Start a new peak interval; returns the peak of the interval that ends."""
        with self._lock:
            ended, self.peak = self.peak, self.live
            self._peak_serial = self._serial
            self._freed_since_peak = []
        return ended

    def peak_set(self) -> PeakSet:
        """What was alive at the current interval's high-water moment."""
        began = time.perf_counter()
        with self._lock:
            table, freed = list(self._table.values()), list(self._freed_since_peak)
            cutoff, peak = self._peak_serial, self.peak
        rows = [row for row in table if row[SERIAL] <= cutoff]
        rows.extend(freed)
        self.peak_sets += 1
        self.rows_read += len(table) + len(freed)
        self.seconds += time.perf_counter() - began
        return PeakSet(peak, rows)

    def alive(self, rows: list[list]) -> set[int]:
        """The serials of `rows` whose storage is still alive."""
        with self._lock:
            table = self._table
            return {row[SERIAL] for row in rows if row[SERIAL] in table}

    def sites(self) -> dict:
        """Census key -> allocation site, for the live storages that have one."""
        with self._lock:
            return {row[KEY]: row[SITE] for row in self._table.values()
                    if row[SITE] is not None and row[KEY] is not None}

    def note_owners(self, owners: dict, components: dict) -> None:
        """Keep on each live storage's row the component a census names it under, so that
        at_peak still names it once it is freed (rows are shared with the peak sets)."""
        with self._lock:
            rows = list(self._table.values())
        for row in rows:
            owner = owners.get(row[KEY])
            if owner is not None and owner != UNOWNED:
                row[SEEN_OWNER] = owner
                row[SEEN_CATEGORY] = (components.get(owner) or {}).get("category") or OTHER

    def __enter__(self):
        _RESIZE_WATCHERS.append(self)
        _watch_resizes()
        registration = torch.nn.modules.module
        self._hooks = [registration.register_module_parameter_registration_hook(self._registered_parameter),
                       registration.register_module_buffer_registration_hook(self._registered_buffer)]
        provenance.counting(self, True)
        return super().__enter__()

    def __exit__(self, *exc):
        _RESIZE_WATCHERS.remove(self)
        _watch_resizes()
        provenance.counting(self, False)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        with AUDITOR_CODE:  # the meter's bookkeeping inside the program's op: never a stage
            kind = self._op_kinds.get(id(func))  # operators live as long as torch: id() is theirs
            if kind is None:
                kind = self._op_kinds[id(func)] = _op_kind(func)
            first = args[0] if args else None
            if _is_parameter(first) and id(first) not in self._marked:
                self._marked.add(id(first))  # once per parameter: a forward pass meets each again
                self._mark(first, PARAMETER)  # its aliases (detach, t, views) then lead back to it
            origin = self._copied_from(kind, args) if kind else None
            if origin is not None and kind == _COPIES_INTO:
                self._copied_into(first, origin)
                return out
            for item in tree_flatten(out)[0]:
                if isinstance(item, torch.Tensor):
                    self._track(item, func, self.stage_path, origin)
        return out

    # -- provenance (auditor.capture.census.provenance) ---------------------------------------------------

    def provenance(self) -> provenance.Provenance:
        """The live copies of the weights and module buffers, by census key."""
        found = provenance.Provenance(followed=True)
        with self._lock:
            cells = list(self._cells.values())
        for cell in cells:
            if cell[KIND] == COPY and cell[OWN_KEY] is not None:
                found.copies[cell[OWN_KEY]] = (cell[COVERED], cell[SOURCE])
            elif cell[KIND] == BUFFER and cell[OWN_KEY] is not None:
                found.buffers.add(cell[OWN_KEY])
        return found

    def _cell(self, tensor: torch.Tensor) -> list | None:
        try:
            return self._cells.get(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):  # storage-less layouts
            return None

    def _mark(self, tensor: torch.Tensor, kind: int) -> None:
        """`tensor`'s storage is a parameter's or a module buffer's (a copy made into a new
        parameter, `nn.Parameter(W.clone())`, is a parameter from then on)."""
        cell = self._cell(tensor)
        if cell is None and tensor.device.type != "meta":  # made where no operator showed it
            self._track(tensor, None, self.stage_path)
            cell = self._cell(tensor)
        if cell is None or cell[KIND] == kind:
            return
        cell[KIND] = kind
        if kind == PARAMETER:
            cell[ITEMSIZE], cell[COVERED], cell[SOURCE] = (tensor.element_size(), 0,
                                                           self._key(tensor.untyped_storage(), tensor))
        elif kind == BUFFER:
            cell[OWN_KEY] = self._key(tensor.untyped_storage(), tensor)
        row = self._table.get(cell[SERIAL])
        if row is not None:
            row[COPY_OF], row[ORIGIN] = cell[COVERED], kind

    def _registered_parameter(self, module, name, param) -> None:
        if isinstance(param, torch.Tensor):
            with AUDITOR_CODE:
                self._mark(param, PARAMETER)

    def _registered_buffer(self, module, name, buffer) -> None:
        if isinstance(buffer, torch.Tensor):
            with AUDITOR_CODE:
                self._mark(buffer, BUFFER)

    def _copied_from(self, kind: int, args: tuple) -> tuple | None:
        """(the weights' element size, bytes of the weights copied or None: the output's
        elements, the key of the parameter storage) when a copying operator reads the weights
        or a copy of them; None otherwise."""
        if kind == _COPIES_LIST:
            sources = [t for t in (args[0] if args and isinstance(args[0], (list, tuple)) else ())
                       if isinstance(t, torch.Tensor)]
        else:
            source = args[1 if kind == _COPIES_INTO else 0] if len(args) > (kind == _COPIES_INTO) else None
            sources = [source] if isinstance(source, torch.Tensor) else []
        found, covered = None, 0
        for source in sources:
            if _is_parameter(source):
                self._mark(source, PARAMETER)
            cell = self._cell(source)
            if cell is None or cell[KIND] not in (PARAMETER, COPY):
                continue
            found = found or (cell[ITEMSIZE], cell[SOURCE])
            covered += source.numel() * cell[ITEMSIZE]
        if found is None:
            return None
        return found[0], covered if kind in (_COPIES_LIST, _COPIES_INTO) else None, found[1]

    def _copied_into(self, dest, origin: tuple) -> None:
        """`dest.copy_(weights)`: dest's storage holds a copy, unless it is a parameter's (a
        restore) or a buffer's."""
        if not isinstance(dest, torch.Tensor) or _is_parameter(dest):
            return
        cell = self._cell(dest)
        if cell is None or cell[KIND] in (PARAMETER, BUFFER):
            return
        itemsize, covered, source = origin
        most = cell[1] // max(dest.element_size(), 1) * itemsize  # the whole storage a copy
        self._as_copy(cell, dest, itemsize, min(cell[COVERED] + covered, most), source)

    def _as_copy(self, cell: list, tensor: torch.Tensor, itemsize: int, covered: int, source) -> None:
        if cell[KIND] != COPY:
            cell[OWN_KEY] = self._key(tensor.untyped_storage(), tensor)
        cell[KIND], cell[ITEMSIZE], cell[COVERED], cell[SOURCE] = COPY, itemsize, covered, source
        row = self._table.get(cell[SERIAL])
        if row is not None:
            row[COPY_OF], row[ORIGIN] = covered, COPY
            if row[SITE] is None and row[3] is not None:  # a copy of any size is named by its line
                row[SITE] = allocation_site(row[3])

    def _track(self, tensor: torch.Tensor, func, created_in: str | None, origin: tuple | None = None) -> None:
        if tensor.device.type == "meta":  # allocates nothing (a fake tensor reports its fake device)
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return
        with self._lock:
            if storage in self._cells:
                return
            if not _holds_memory(tensor, storage):  # a wrapper subclass: its inner tensors do
                self._track_inner(tensor, func, created_in)
                return
            size = storage.nbytes()
            self._serial += 1
            serial = self._serial
            cell = self._cells[storage] = [serial, size, False, 0, 0, 0, None, None]
            self._count(cell, tensor.device.type == "cpu")
            if self.at_peak:
                op = _op_name(func)
                where = allocation_site(op) if op is not None and size >= SITE_MIN_BYTES else None
                self._table[serial] = [serial, size, created_in, op,
                                       self._key(storage, tensor), tensor.dtype is torch.bool,
                                       None, None, where, 0, 0]
            if origin is not None:
                itemsize, covered, source = origin
                self._as_copy(cell, tensor, itemsize, tensor.numel() * itemsize if covered is None else covered,
                              source)
            self._new_high()
        weakref.finalize(storage, self._release, cell)

    def _new_high(self) -> None:
        if self.live > self.peak:
            self.peak = self.live
            self._peak_serial = self._serial
            if self._freed_since_peak:
                self._freed_since_peak = []

    def resized(self, storage) -> None:
        """A counted storage changed size in place: the old size is freed, the new one made
        (a new serial, so a peak set taken before keeps the old size)."""
        with self._lock:
            cell = self._cells.get(storage)
            if cell is None or storage.nbytes() == cell[1]:
                return
            row = self._table.get(cell[0])
            self._release(cell)
            self._serial += 1
            cell[0], cell[1] = self._serial, storage.nbytes()
            self._count(cell, storage.device.type == "cpu")
            if self.at_peak and row is not None:
                self._table[cell[0]] = [cell[0], cell[1], self.stage_path, "resize_", *row[4:]]
            self._new_high()

    def _track_inner(self, tensor: torch.Tensor, func, created_in: str | None) -> None:
        """A wrapper's memory is its inner tensors' (a DTensor's local shard): the operator that
        made them ran inside the wrapper's dispatch, which this mode does not see."""
        flatten = getattr(tensor, "__tensor_flatten__", None)
        if flatten is None:
            return
        for name in flatten()[0]:
            inner = getattr(tensor, name, None)
            if isinstance(inner, torch.Tensor):
                self._track(inner, func, created_in)

    def _key(self, storage, tensor):
        """The key the census lists the storage's owner under."""
        try:
            return storage_key(storage, is_fake(tensor))
        except Exception:  # a storage whose address cannot be read: no owner for it
            return None

    def _count(self, cell: list, on_cpu: bool) -> None:
        """A storage of cell[1] bytes is born; glibc's heap serves it if it is on the CPU and
        below the mmap threshold (larger requests are mmapped, and given back when freed)."""
        size = cell[1]
        self.live += size
        cell[2] = on_cpu and size < self.mmap_threshold
        if cell[2]:
            self.heap_live += size
            self.heap_high_water = max(self.heap_high_water, self.heap_live)

    def _release(self, cell: list) -> None:
        with self._lock:
            serial, size, on_heap = cell[:3]
            self.live -= size
            if on_heap:
                self.heap_live -= size
            if self._dynamic_threshold and self.mmap_threshold < size <= MMAP_THRESHOLD_MAX:
                self.mmap_threshold = size  # glibc's rule when a block it mmapped is freed
            row = self._table.pop(serial, None)
            if row is not None and serial <= self._peak_serial:
                self._freed_since_peak.append(row)


_RESIZE_WATCHERS: list[LiveTensorMeter] = []  # the meters counting now
_RESIZE = torch.UntypedStorage.resize_


def _resize_counted(storage, size):
    out = _RESIZE(storage, size)
    with AUDITOR_CODE:
        for meter in list(_RESIZE_WATCHERS):
            meter.resized(storage)
    return out


def _watch_resizes() -> None:
    """`UntypedStorage.resize_` tells the counting meters while there are any; torch's own otherwise."""
    # replacing the method is the point: resizes are seen only through it
    torch.UntypedStorage.resize_ = _resize_counted if _RESIZE_WATCHERS else _RESIZE  # type: ignore[method-assign]


class LiveTensorProbe:
    """The meter as an audit probe: start, end and true peak of live tensor bytes per stage,
    and what was alive at that peak (`peak_set`, grouped into rows by `at_peak`).

    A dispatch mode is thread-local: it counts tensors made on the thread that started the
    audit (on CPU, autograd's backward runs there too).
    """
    key = "live_tensors"
    # Class-wide, for benchmarks/peak_composition_overhead.py, which measures the meter without it.
    keeps_composition = True

    def __init__(self) -> None:
        self._meter = LiveTensorMeter(self.keeps_composition)
        self._meter.seed_existing()
        self._meter.__enter__()
        self._closed = False

    def read(self) -> tuple[int, int, int]:
        live = self._meter.live
        return live, live, max(self._meter.peak, live)

    def reset(self) -> None:
        self._meter.reset_peak()

    def set_stage(self, path: str | None) -> None:
        self._meter.stage_path = path

    def peak_set(self) -> PeakSet:
        return self._meter.peak_set()

    def alive(self, peak: PeakSet) -> set[int]:
        return self._meter.alive(peak.rows)

    def sites(self) -> dict:
        return self._meter.sites()

    def note_owners(self, census: dict) -> None:
        self._meter.note_owners(census["owners"], census["components"])

    def cost(self) -> dict:
        """at_peak's boundary work so far: passes over the live table, the rows they read,
        seconds in them and in grouping rows."""
        return {"peak_sets": self._meter.peak_sets, "rows_read": self._meter.rows_read,
                "seconds": self._meter.seconds, "live_rows": len(self._meter._table)}

    def at_peak(self, peak: PeakSet, alive_at_end: set[int], census: dict | None) -> AtPeak:
        """`peak` grouped by (owner, category, created_in, op), largest first. `alive_at_end`:
        the serials alive when the stage (or interval) ended; `census`: {"owners": {key:
        component}, "components": {...}} from a census taken since, or None (census off)."""
        began = time.perf_counter()
        alive_now = self._meter.alive(peak.rows) if census is not None else set()
        # read once, not per row: owners only when some row is still alive (a census without
        # owners is never asked), components whenever a census is given
        owners: dict = census["owners"] if census is not None and alive_now else {}
        components: dict = census["components"] if census is not None else {}
        groups: dict[tuple, list] = {}
        for row in peak.rows:  # at every stage end: kept to plain operations, no call per row
            serial, size, created_in, op, key, is_bool, seen_owner, seen_category, where, copy_of, origin = row
            kept = serial in alive_at_end
            owner = owners.get(key) if serial in alive_now else None
            # what provenance says it is, when no census names it (auditor.capture.census.provenance)
            made = SAVED_COPIES if copy_of else BUFFERS if origin == BUFFER else MASKS if is_bool else None
            if seen_owner is None and where is not None and (not kept or communication_buffer(where)):
                seen_owner = f"{ALLOCATED_AT} {where}"  # a temporary, or a buffer the site names
                seen_category = made or ACTIVATIONS
            if owner is not None:
                category = (components.get(owner) or {}).get("category") or OTHER
            elif seen_owner is not None:  # freed since, or out of the census's sight now
                owner, category = seen_owner, seen_category
            elif not kept:
                category = made if made and made != MASKS else ACTIVATIONS  # made and freed inside: a temporary
            elif census is None:
                category = made or NO_CENSUS
            else:  # the census cannot see it (held only by C++, e.g. saved for backward)
                category = made or OTHER
            group = groups.get((owner, category, created_in, op, kept))
            if group is None:
                groups[owner, category, created_in, op, kept] = [size, 1]
            else:
                group[0] += size
                group[1] += 1
        ordered = sorted(groups.items(), key=lambda item: -item[1][0])
        rows = [written_as(AtPeakRow(owner=owner, category=category, created_in=created_in, op=op, bytes=size,
                                     tensors=count, alive_at_end=kept), AT_PEAK_ROW_KEYS)
                for (owner, category, created_in, op, kept), (size, count) in ordered[:MAX_ROWS]]
        left = ordered[MAX_ROWS:]
        self._meter.seconds += time.perf_counter() - began
        return AtPeak(bytes=peak.bytes, rows=rows, rows_left_out=len(left),
                      bytes_left_out=sum(size for _, (size, _) in left))

    def entry(self, start: int, end: int, peak: int) -> LiveTensors:
        """Its readings; `at_peak` is given at the interval's end (auditor.capture.probe_set)."""
        return LiveTensors(start=start, end=end, peak=peak, allocator_threshold=self._meter.mmap_threshold,
                           heap_high_water=self._meter.heap_high_water)

    def describe(self) -> dict:
        method = "torch dispatch mode, storages counted once"
        if self._meter.at_peak:
            method += ("; at_peak: the exact set alive at each interval's high (live table and "
                       "the rows freed since the high, no copy while the program runs)")
        return {"state": "on", "method": method, "copies": COPIES_FOLLOWED}

    def close(self) -> None:
        if not self._closed:
            self._meter.__exit__(None, None, None)
            self._closed = True
            del self._meter  # its live table goes with it, whoever still holds the probe


def _holds_memory(tensor: torch.Tensor, storage) -> bool:
    """False for a wrapper subclass's own storage (DTensor, AsyncCollectiveTensor): it reports a
    size but has no data pointer. A fake tensor's has none by design, and stands for memory."""
    if is_fake(tensor):
        return True
    try:
        storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return False
    return True


COPIES_FOLLOWED = ("storages made by copying operators (clone, _to_copy, copy_, index, cat ...) "
                   "from a parameter's storage or a copy of one (auditor.capture.census.provenance)")


_PARAMETER = torch.nn.Parameter


def _is_parameter(value) -> bool:
    """isinstance(value, nn.Parameter), without the Python-level instance check that
    Parameter's metaclass runs for every object (a plain tensor is rejected by its type)."""
    kind = type(value)
    return kind is _PARAMETER or (kind is not torch.Tensor and kind is not tuple and kind is not list
                                  and isinstance(value, _PARAMETER))


def _op_kind(func) -> int:
    """What an operator does for provenance: copies its input's values, a list's, into its first
    argument, or nothing followed."""
    name = _op_name(func) or ""
    if name == provenance.COPY_INTO:
        return _COPIES_INTO
    if name in provenance.LIST_OPS:
        return _COPIES_LIST
    return _COPIES if provenance.is_copy(name) else _PLAIN


def _op_name(func) -> str | None:
    """"aten::mul" for every overload of mul: the operator, as a user would name it."""
    if func is None:
        return None
    try:
        return func._schema.name
    except Exception:  # not an OpOverload (a higher-order operator)
        return getattr(func, "__name__", None) or str(func)
