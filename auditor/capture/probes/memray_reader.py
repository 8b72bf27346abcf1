"""memray's trace read back in a process of its own: `python -m auditor.capture.probes.memray_reader
FOLDER`, started by auditor.capture.probes.memray_trace once the tracker has stopped. Reading
resolves native symbols (memray maps each library's debug sections); under an address-space
limit (RLIMIT_AS) that can crash the reader with SIGSEGV, which must cost the memray section,
never the audited process's exit status or its record.

It prints the summary as one JSON line on stdout (memray's peak, the sites alive at its
high-water mark, the times in unix ms of the highest memory snapshot and of the one after it),
then waits: a line `flamegraph` on stdin writes the flamegraph into FOLDER (after the run
record, which a full disk must not cost) and prints its file name as JSON (null: none); the
trace is read once for both. End of stdin ends it. A failure: one line on stderr, exit 1.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from auditor.capture.probes import memray_trace
from auditor.record.run_folder import TRACE_FILE


def summary(reader, records) -> dict:
    sites, auditor_bytes = memray_trace.top_sites(records)
    return {"peak_memory": reader.metadata.peak_memory, "total_allocations": reader.metadata.total_allocations,
            "sites": sites, "auditor_bytes": auditor_bytes, "snapshots": _high_snapshot(reader)}


def _high_snapshot(reader) -> dict | None:
    """The highest memory snapshot's heap and stamp, and the next stamp (unix ms); None without."""
    try:
        snapshots = sorted(reader.get_memory_snapshots(), key=lambda snapshot: snapshot.time)
    except (AttributeError, RuntimeError, OSError):  # an older memray or a damaged trace
        return None
    best = max(snapshots, key=lambda snapshot: snapshot.heap, default=None)
    if best is None:
        return None
    later = [snapshot.time for snapshot in snapshots if snapshot.time > best.time]
    return {"heap": best.heap, "time_ms": best.time, "next_ms": min(later) if later else None}


def serve(folder: Path) -> None:
    from memray import FileReader
    reader = FileReader(os.fspath(folder / TRACE_FILE))
    records = list(reader.get_high_watermark_allocation_records(merge_threads=True))
    print(json.dumps(summary(reader, records)), flush=True)
    for line in sys.stdin:
        if line.strip() == "flamegraph":
            print(json.dumps(memray_trace.write_flamegraph(reader, records, folder)), flush=True)
            return


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("memray_reader: error: usage: python -m auditor.capture.probes.memray_reader FOLDER", file=sys.stderr)
        return 2
    try:
        serve(Path(argv[0]))
    except Exception as error:  # one line for the audit's warning
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
