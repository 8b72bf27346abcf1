"""The comparison record: plain JSON data, written once the runs are done, from which every
report is rendered (again, later, elsewhere).

    schema        "auditor.comparison/1"
    name, command, created_at, repeats, require_result
    environment   {python, platform, cpu, cpu_count, memory_total, libraries{...},
                   load_average_start, load_average_end}
    sides         [{name, role ("baseline" | "variant"), command [args; "{run_dir}" marks the
                    run folder], tolerance {elements | fraction} | null (given by the user)}]
    reference     "SIDE run 1": the result every other run is compared with
    runs          [in the order they ran:
                   {order, side, repeat, started_at, load_average [1, 5, 15 min], command,
                    exit_status, peak_rss, loaded_rss | null, wall_s, cpu_s,
                    tolerance | null (declared by the run), reported {...},
                    result null | {kind ("file" | "digest"), digest, elements | null,
                                   same_as_reference, differing_elements | null}}]
    interrupted   (only when the comparison was stopped) {signal ("SIGINT", "SIGTERM", ...), run
                   ("lean run 2": the run cut short, not in `runs`), why (one line)}

Bytes and seconds throughout. Fields may be added; these keep their meaning.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SCHEMA = "auditor.comparison/1"


class ComparisonRecordError(ValueError):
    """A file that is not a comparison record this version can read."""


@dataclass
class Comparison:
    record: dict

    @property
    def summary(self) -> dict:
        from auditor.comparison.verdict import summarise
        return summarise(self.record)

    @property
    def failed(self) -> bool:
        """True when a variant claims a saving but its result differs beyond its tolerance
        (or gives no result while one is required)."""
        return self.summary["failed"]

    def save(self, path: str | Path) -> Path:
        from auditor.record.run_folder import write_json_atomically  # a full disk never leaves half a record
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, self.record)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Comparison:
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ComparisonRecordError(f"cannot read comparison record {str(path)!r}: {error}") from None
        if not isinstance(record, dict) or record.get("schema") != SCHEMA:
            found = record.get("schema") if isinstance(record, dict) else type(record).__name__
            raise ComparisonRecordError(f"{str(path)!r} is not a comparison record "
                                        f"(schema {found!r}, expected {SCHEMA!r})")
        return cls(record)
